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
	timer    *time.Timer
	timerC   <-chan time.Time // timer.C while a request is in flight, else nil
}

func (d *dispatcher) handleProgressRequest(p *progressWaiter) {
	switch {
	case d.failed != nil:
		p.reply <- progressResult{err: d.failed}
	case len(d.watches) == 0:
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
	p.stopTimer()
}

// handleProgressTimeout asks again for everyone still waiting.
func (d *dispatcher) handleProgressTimeout() {
	p := &d.progress
	gone := func(w *progressWaiter) bool { return w.ctx.Err() != nil }
	p.waiting = append(slices.DeleteFunc(p.waiting, gone), slices.DeleteFunc(p.next, gone)...)
	p.next = nil
	p.timerC = nil
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
	if p.timer == nil {
		p.timer = time.NewTimer(p.retry)
	} else {
		p.timer.Reset(p.retry)
	}
	p.timerC = p.timer.C
}

func (p *progressState) stopTimer() {
	if p.timer != nil {
		p.timer.Stop()
	}
	p.timerC = nil
}

// fail answers every waiting call with err.
func (p *progressState) fail(err error) {
	for _, w := range slices.Concat(p.waiting, p.next) {
		w.reply <- progressResult{err: err}
	}
	p.waiting, p.next, p.inFlight = nil, nil, false
	p.stopTimer()
}
