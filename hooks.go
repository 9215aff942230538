package etcdwatch

// hooks let tests observe the Stream's goroutines at exact points, so that
// they wait for an event rather than poll for a state. A Stream outside
// tests has none: each call is then a nil check.
type hooks struct {
	onReceived func() // the session handed a response to the dispatcher
	onHandled  func() // the dispatcher handled a response
	onTook     func() // a pump accounted for a response its consumer took
}

func (h *hooks) received() {
	if h != nil && h.onReceived != nil {
		h.onReceived()
	}
}

func (h *hooks) handled() {
	if h != nil && h.onHandled != nil {
		h.onHandled()
	}
}

func (h *hooks) took() {
	if h != nil && h.onTook != nil {
		h.onTook()
	}
}
