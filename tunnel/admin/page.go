package admin

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/warren-tunnel/warren/tunnel"
)

// Listing limits: a page holds DefaultPageSize items unless ?limit= asks for another number,
// at most MaxPageSize, so that no answer grows past a few megabytes whatever the edge holds.
const (
	DefaultPageSize = 500
	MaxPageSize     = 1000
	// MaxPageMembers caps the members one page of GET /api/groups lists in all: a page ends
	// early (with a next cursor) rather than pass it, unless its first group alone does.
	MaxPageMembers = 10000
)

// Endpoint is a route reserved by the edge's configuration, listed by GET /api/groups with
// zero members while none is registered.
type Endpoint = tunnel.IdleEndpoint

// writePage sorts items by key, answers the page after ?cursor= of at most ?limit= items,
// and names the next page in a Link header (rel="next") and X-Next-Cursor when there is one.
// A bad limit or cursor is 400.
//
// weight, when not nil, is an item's size in members: a page also ends before the members
// it holds pass MaxPageMembers (it always holds at least one item).
func writePage[T any](w http.ResponseWriter, r *http.Request, items []T, key func(T) []string, weight func(T) int) {
	q := r.URL.Query()
	limit := DefaultPageSize
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxPageSize {
			writeError(w, http.StatusBadRequest, "limit must be a whole number from 1 to "+strconv.Itoa(MaxPageSize))
			return
		}
		limit = n
	}
	cmpKey := func(a, b []string) int { return slices.Compare(a, b) }
	slices.SortFunc(items, func(a, b T) int { return cmpKey(key(a), key(b)) })
	if c := q.Get("cursor"); c != "" {
		after, ok := decodeCursor(c)
		if !ok {
			writeError(w, http.StatusBadRequest, "invalid cursor")
			return
		}
		i, _ := slices.BinarySearchFunc(items, after, func(it T, k []string) int {
			if cmpKey(key(it), k) <= 0 {
				return -1
			}
			return 1
		})
		items = items[i:]
	}
	asked := limit
	if weight != nil {
		total := 0
		for i, it := range items[:min(limit, len(items))] {
			if total += weight(it); total > MaxPageMembers && i > 0 {
				limit = i
				break
			}
		}
	}
	if len(items) > limit {
		next := encodeCursor(key(items[limit-1]))
		items = items[:limit]
		u := *r.URL
		v := u.Query()
		v.Set("cursor", next)
		v.Set("limit", strconv.Itoa(asked))
		u.RawQuery = v.Encode()
		w.Header().Set("Link", "<"+(&url.URL{Path: u.Path, RawQuery: u.RawQuery}).String()+`>; rel="next"`)
		w.Header().Set("X-Next-Cursor", next)
	}
	writeJSON(w, http.StatusOK, items)
}

func encodeCursor(k []string) string {
	b, _ := json.Marshal(k)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) ([]string, bool) {
	if len(s) > 4096 || strings.ContainsAny(s, "=+/") {
		return nil, false
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, false
	}
	var k []string
	if json.Unmarshal(b, &k) != nil || len(k) == 0 {
		return nil, false
	}
	return k, true
}
