package webhook

import (
	"encoding/hex"
	"time"
)

// Values of [Payload.Event].
const (
	// EventGroupZeroHealthy: the group fell to zero healthy members (the
	// alert document's one event).
	EventGroupZeroHealthy = "group_zero_healthy"
	// EventGroupRecovered, sent only when asked for
	// (DebouncerConfig.Recovery): the group has a healthy member again after
	// a fall to zero that was reported, or that began and ended while its
	// alerts were held back by the minimum interval.
	EventGroupRecovered = "group_recovered"
)

// timeLayout is RFC 3339 with a numeric zone offset, so a UTC time renders as
// "+00:00" exactly like the documented example payload.
const timeLayout = "2006-01-02T15:04:05-07:00"

// Payload is the JSON body POSTed to every destination of one alert. Field
// names and their order match the documented alert body:
//
//	{"event":"group_zero_healthy","region_id":"eu","protocol":"http",
//	 "label":"pool","group_name":"web","key_hash_short":"deadbeef",
//	 "member_count":2,"at":"2026-05-06T13:24:55+00:00"}
type Payload struct {
	// Event names the alert: EventGroupZeroHealthy or EventGroupRecovered.
	Event string `json:"event"`
	// RegionID identifies the edge (region) that observed the change.
	RegionID string `json:"region_id"`
	// Protocol is the group's protocol: "http", "https" or "tcp".
	Protocol string `json:"protocol"`
	// Label is the group's routing label (subdomain or TCP label).
	Label string `json:"label"`
	// GroupName is the display name of the pool.
	GroupName string `json:"group_name"`
	// KeyHashShort is the first 8 hex characters of the group's key hash;
	// see ShortHash.
	KeyHashShort string `json:"key_hash_short"`
	// MemberCount is the number of members in the group at its latest
	// change (for EventGroupZeroHealthy, none of them healthy).
	MemberCount int `json:"member_count"`
	// At is when the group entered the state Event reports, in RFC 3339;
	// see FormatTime.
	At string `json:"at"`
}

// ShortHash returns the first 8 hex characters of a group's SHA-256 key hash,
// the value of [Payload.KeyHashShort]. It is stable across reconnects and
// short enough not to reveal the hash.
func ShortHash(keyHash [32]byte) string {
	return hex.EncodeToString(keyHash[:4])
}

// FormatTime renders t in UTC as RFC 3339 with a "+00:00" offset, the form
// used by [Payload.At] (for example "2026-05-06T13:24:55+00:00").
func FormatTime(t time.Time) string {
	return t.UTC().Format(timeLayout)
}
