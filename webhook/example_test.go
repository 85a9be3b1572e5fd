package webhook_test

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/warren-tunnel/warren/webhook"
)

// The edge feeds every health change into a Debouncer, which decides when to
// alert; each alert goes to the operator URL and the group's tenant URLs.
func Example() {
	// A stand-in for the operator's alert receiver.
	received := make(chan string, 1)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		received <- string(body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()

	outcomes := make(chan webhook.Result, 1)
	sender := webhook.NewSender(webhook.SenderConfig{
		OnResult: func(_ webhook.Destination, r webhook.Result, _ error) { outcomes <- r },
	})
	defer sender.Close()

	keyHash := sha256.Sum256([]byte("shared-secret-for-this-pool"))
	// Tenant URLs collected from the group's members; none here.
	dests := webhook.Destinations(receiver.URL, nil)
	debouncer := webhook.NewDebouncer(webhook.DebouncerConfig[int]{
		Fire: func(a webhook.Alert[int]) {
			sender.Send(dests, webhook.Payload{
				Event:        a.Event,
				RegionID:     "eu",
				Protocol:     "http",
				Label:        "pool",
				GroupName:    "web",
				KeyHashShort: webhook.ShortHash(keyHash),
				MemberCount:  a.Value,
				At:           webhook.FormatTime(time.Date(2026, 5, 6, 13, 24, 55, 0, time.UTC)),
			})
		},
	})
	defer debouncer.Close()

	// Healthy members of a two-member pool: 2, 1, then 0.
	for _, healthy := range []int{2, 1, 0, 0} {
		debouncer.Observe("web", healthy, 2)
	}

	fmt.Println(<-received)
	fmt.Println(<-outcomes)
	// Output:
	// {"event":"group_zero_healthy","region_id":"eu","protocol":"http","label":"pool","group_name":"web","key_hash_short":"569b69cd","member_count":2,"at":"2026-05-06T13:24:55+00:00"}
	// success
}

// By default a Debouncer alerts on every fall to zero healthy members at
// once, not for a pool that never had a healthy member, not while a pool
// stays down, and not when it recovers.
func ExampleDebouncer() {
	d := webhook.NewDebouncer(webhook.DebouncerConfig[string]{
		Fire: func(a webhook.Alert[string]) { fmt.Println(a.Event, "after", a.Value) },
	})
	defer d.Close()
	for i, healthy := range []int{0, 2, 1, 0, 0, 1, 0} {
		d.Observe("web", healthy, fmt.Sprintf("observation %d", i))
	}
	// Output:
	// group_zero_healthy after observation 3
	// group_zero_healthy after observation 6
}

// The opt-ins: recovery alerts, and a minimum interval between two alerts of
// a pool, which holds back what happens inside it until it is over.
func ExampleDebouncer_optIns() {
	d := webhook.NewDebouncer(webhook.DebouncerConfig[string]{
		MinInterval: time.Hour,
		Recovery:    true,
		Fire:        func(a webhook.Alert[string]) { fmt.Println(a.Event, "after", a.Value) },
	})
	defer d.Close() // cancels the alerts still held back
	for i, healthy := range []int{0, 2, 1, 0, 0, 1, 0} {
		d.Observe("web", healthy, fmt.Sprintf("observation %d", i))
	}
	// Output: group_zero_healthy after observation 3
}

// Destinations puts the trusted operator URL first and sends each unique
// tenant URL once.
func ExampleDestinations() {
	for _, d := range webhook.Destinations("https://ops.example/hook", []string{
		"https://hooks.example/team-a", "https://hooks.example/team-a", "https://hooks.example/team-b",
	}) {
		fmt.Println(d.URL, d.Trusted)
	}
	// Output:
	// https://ops.example/hook true
	// https://hooks.example/team-a false
	// https://hooks.example/team-b false
}
