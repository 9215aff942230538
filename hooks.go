package etcdwatch

// hook is a point in the Stream's goroutines that a test may wait for.
type hook uint8

const (
	hookReceived  hook = iota // the session is handing a response to the dispatcher (just before; see session.hand)
	hookResponse              // the dispatcher handled a response
	hookCommand               // the dispatcher handled a command
	hookStreamEnd             // the dispatcher handled the end of a stream
	hookPumpStart             // the dispatcher is about to start a pump
	hookTook                  // a pump accounted for a response its consumer took
	hookPumpDone              // a pump ended its run
	hookExited                // a session ended, with the first error any of its loops or the dispatcher gave it
	hookCount
)

// hooks let tests observe the Stream's goroutines at exact points, so that
// they wait for an event rather than poll for a state, or sleep. A Stream
// outside tests has none: each call is then a nil check.
type hooks struct {
	on func(hook) // called from the goroutine where the point is, after it (hookReceived: just before)
}

func (h *hooks) at(p hook) {
	if h != nil {
		h.on(p)
	}
}
