package mux

// StreamWindow is each data stream's receive window: the most a member may have sent on a
// stream that the edge has not read yet, and so what one response whose public client
// stopped reading can hold at the edge (internal/proxy's stalled-response budgets count it).
const StreamWindow = streamWindow
