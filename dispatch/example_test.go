package dispatch_test

import (
	"fmt"

	"github.com/warren-tunnel/warren/dispatch"
)

// members is a pool view: the active streams of each member.
type members []int64

func (m members) Len() int         { return len(m) }
func (m members) Load(i int) int64 { return m[i] }

func ExampleLeastStreams() {
	s, _ := dispatch.New(dispatch.NameLeastStreams)
	fmt.Println(s.Pick(members{4, 1, 3}))
	// Two idle members: sequential picks alternate.
	fmt.Println(s.Pick(members{0, 0}), s.Pick(members{0, 0}))
	// Output:
	// 1
	// 0 1
}
