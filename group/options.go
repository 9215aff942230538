package group

import (
	"fmt"
	"time"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
)

// Option configures a Group. Options are applied in order over the
// defaults, then validated together by New or Dial.
type Option func(*options)

// options are a Group's settings, read only once validated.
type options struct {
	streams    int                // WithStreams'; the constructor's default unless set
	streamsSet bool               // WithStreams was given
	stream     []etcdwatch.Option // for every Stream, pinned ones too
	dial       []dial.Option      // Dial's, for every connection
	dialSet    bool               // WithDialOptions was given
	settle     time.Duration      // WithHoming's
	settleSet  bool               // WithHoming was given
}

// defaultSettle is WithHoming's default.
const defaultSettle = 5 * time.Second

// WithHoming sets how long a member of Dial's must have been back,
// connected and with a leader, before the Streams whose home it is leave
// the members they moved to and go back to it (see Dial): long enough
// that a member going up and down again does not move them each time, and
// that a member just restarted has caught up with its cluster. Going home
// costs what a member's failure does: each of those Streams' watches is
// created again, from its own revision. 0 never ends a Stream's gRPC
// stream to send it home. Whatever the setting, a Stream away from home
// whose gRPC stream ends for another reason opens the next one at home if
// the home is up. Default 5s; at least 0. New, whose Streams have no
// home, refuses it.
func WithHoming(settle time.Duration) Option {
	return func(o *options) { o.settle, o.settleSet = settle, true }
}

// WithStreams sets how many Streams the group keeps (pinned ones come on
// top): watches are spread over them. Default: with New, 3, one per member
// of the usual cluster of three, if the connection spreads them; with
// Dial, one per endpoint. At least 1.
func WithStreams(n int) Option {
	return func(o *options) { o.streams, o.streamsSet = n, true }
}

// WithStreamOptions sets the options every Stream of the group is opened
// with, pinned ones included, as etcdwatch.Open takes them. Default: none,
// so Open's defaults.
func WithStreamOptions(opts ...etcdwatch.Option) Option {
	return func(o *options) { o.stream = append(o.stream, opts...) }
}

// WithDialOptions sets the options of Dial's connections (transport
// security, a password, gRPC's own options), as dial.New takes them: Dial
// makes one connection per endpoint with them, each to that member alone. Dial needs one of
// dial.WithTLS, dial.WithTLSFiles or dial.WithInsecure among them, as
// dial.New does; New refuses this option, having no connection to dial.
// Default: none.
func WithDialOptions(opts ...dial.Option) Option {
	return func(o *options) {
		o.dial = append(o.dial, opts...)
		o.dialSet = true
	}
}

// apply applies opts over the defaults, streams being the constructor's
// default number of Streams.
func apply(streams int, opts []Option) options {
	o := options{settle: defaultSettle}
	for _, opt := range opts {
		opt(&o)
	}
	if !o.streamsSet {
		o.streams = streams
	}
	return o
}

func (o options) validate() error {
	if o.streams < 1 {
		return fmt.Errorf("%w: WithStreams(%d) must be at least 1", etcdwatch.ErrInvalidArgument, o.streams)
	}
	if o.settle < 0 {
		return fmt.Errorf("%w: WithHoming(%v) must be at least 0", etcdwatch.ErrInvalidArgument, o.settle)
	}
	return nil
}
