package etcdwatch

import (
	"context"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// progressWaiter is one RequestProgress call waiting for an answer.
type progressWaiter struct {
	ctx   context.Context
	reply chan progressResult // buffered 1: the dispatcher never waits on it
}

type progressResult struct {
	rev int64
	err error
}

// progressState tracks RequestProgress calls. Owned by the dispatcher.
//
// An answer satisfies only the calls that joined before the request it may
// answer was sent, so that the revision is never older than the call. Calls
// that join while a request is in flight wait for the next one, sent when
// the answer comes or the retry timer fires (etcd 3.6+ drops a request it
// cannot answer yet, so a request may never be answered).
type progressState struct {
	retry    time.Duration
	waiting  []*progressWaiter // covered by the request in flight
	next     []*progressWaiter // joined after that request was sent
	inFlight bool
	timer    // runs while a request is in flight
}

func (d *dispatcher) handleProgressRequest(p *progressWaiter) {
	switch {
	case d.failed != nil:
		p.reply <- progressResult{err: d.failed}
	case len(d.watches) == 0 && d.pending.Len() == 0 && d.toCreate.Len() == 0:
		p.reply <- progressResult{err: ErrNoWatches}
	case d.progress.inFlight:
		d.progress.next = append(d.progress.next, p)
	default:
		d.progress.waiting = append(d.progress.waiting, p)
		d.sendProgress()
	}
}

// handleStreamProgress takes a stream-wide progress response (id -1): every
// active watch gets a bookmark, and waiting RequestProgress calls the revision.
func (d *dispatcher) handleStreamProgress(resp *pb.WatchResponse) {
	for _, w := range d.watches {
		d.bookmark(w, resp.Header)
	}
	p := &d.progress
	for _, w := range p.waiting {
		w.reply <- progressResult{rev: resp.Header.GetRevision()}
	}
	p.waiting, p.next = p.next, nil
	if len(p.waiting) > 0 {
		d.sendProgress()
		return
	}
	p.inFlight = false
	p.stop()
}

// handleProgressTimeout asks again for everyone still waiting.
func (d *dispatcher) handleProgressTimeout() {
	p := &d.progress
	gone := func(w *progressWaiter) bool { return w.ctx.Err() != nil }
	p.waiting = append(slices.DeleteFunc(p.waiting, gone), slices.DeleteFunc(p.next, gone)...)
	p.next = nil
	if len(p.waiting) == 0 {
		p.inFlight = false
		return
	}
	d.sendProgress()
}

func (d *dispatcher) sendProgress() {
	d.outbox = append(d.outbox, &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{
		ProgressRequest: &pb.WatchProgressRequest{}}})
	p := &d.progress
	p.inFlight = true
	p.reset(p.retry)
}

// suspend forgets the request in flight when its stream ends; the calls
// waiting for it wait for the next stream.
func (p *progressState) suspend() {
	p.waiting = append(p.waiting, p.next...)
	p.next = nil
	p.inFlight = false
	p.stop()
}

// resendProgress asks the new stream for progress on behalf of waiting calls.
func (d *dispatcher) resendProgress() {
	if len(d.progress.waiting) > 0 {
		d.sendProgress()
	}
}

// fail answers every waiting call with err.
func (p *progressState) fail(err error) {
	for _, w := range slices.Concat(p.waiting, p.next) {
		w.reply <- progressResult{err: err}
	}
	p.waiting, p.next, p.inFlight = nil, nil, false
	p.stop()
}
