package view

import "errors"

// ErrClosed ends a View after Close, and a Subscription after its own
// Close or its View's.
var ErrClosed = errors.New("etcdwatch/view: view closed")
