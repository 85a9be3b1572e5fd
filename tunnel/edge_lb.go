package tunnel

import (
	"encoding/hex"
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
)

// applyLB copies a registration's load-balancing settings into its join request; the
// registry checks their ranges.
func applyLB(req *group.JoinRequest, lb *wire.LBInfo) {
	if lb == nil {
		return
	}
	req.Weight, req.Priority = lb.Weight, lb.Priority
	req.SlowStart = time.Duration(min(max(lb.SlowStartMS, -1), int64(group.MaxSlowStart/time.Millisecond)+1)) * time.Millisecond
	req.Affinity, req.RetryIdempotent = lb.Affinity, lb.RetryIdempotent
	for _, k := range lb.PrevKeyHashes {
		var h group.KeyHash
		if b, err := hex.DecodeString(k); err == nil && len(b) == len(h) { // wire.Validate checked it
			copy(h[:], b)
			req.PrevKeyHashes = append(req.PrevKeyHashes, h)
		}
	}
}
