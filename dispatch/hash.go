package dispatch

// FNV-1a 64-bit parameters.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// HashString returns a stable 64-bit hash of s, the same in every process and on every
// machine: FNV-1a 64 followed by the SplitMix64 finalizer, so that similar strings (client
// addresses differing in one digit) give unrelated hashes. It allocates nothing. Use it for
// affinity keys (Keyed.PickKey) and for member identities (Candidates.Hash).
func HashString(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return mix64(h)
}

// mix64 is the SplitMix64 finalizer: a bijection on 64-bit values with full avalanche.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}
