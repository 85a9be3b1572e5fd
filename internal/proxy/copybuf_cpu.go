package proxy

import "sync"

// proxyCopyBufSize is the size of the reverse proxy's copy buffers: that of the pooled
// buffers of internal/mux, which it used before.
const proxyCopyBufSize = 64 << 10

// proxyCopyBufs holds the reverse proxy's copy buffers as array pointers.
var proxyCopyBufs = sync.Pool{New: func() any { return new([proxyCopyBufSize]byte) }}

// copyBufPool is the reverse proxy's httputil.BufferPool. A buffer goes back to the pool
// as the array it is (a slice converted back to its array pointer), where a pool of
// *[]byte must allocate a new slice header for each Put: one allocation less per request.
type copyBufPool struct{}

// Get returns a buffer of proxyCopyBufSize bytes.
func (copyBufPool) Get() []byte { return proxyCopyBufs.Get().(*[proxyCopyBufSize]byte)[:] }

// Put returns b to the pool if it came from it (has its capacity).
func (copyBufPool) Put(b []byte) {
	if cap(b) == proxyCopyBufSize {
		proxyCopyBufs.Put((*[proxyCopyBufSize]byte)(b[:proxyCopyBufSize]))
	}
}
