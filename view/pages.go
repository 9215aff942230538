package view

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/etcdwatch/etcdwatch/internal/rpcerr"
)

// pages reads the range a page at a time, each page at the revision of the
// first, so that the pages together are one revision's state. The first
// page asks for l.page keys, the others for about l.bytes (see pager). It
// asks for the next page as soon as a page arrives, before fn takes its
// keys, so that the server reads one page while fn takes the one before:
// a listing holds at most two pages at once, and asks for one page more
// than it takes when fn fails.
func (l *lister) pages(ctx context.Context, at listing, fn func(*mvccpb.KeyValue) error) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	p := pager{lister: l, req: l.request(at), bytes: l.bytes}
	p.req.Limit = l.page
	next := l.fetch(ctx, p.req)
	defer func() {
		cancel()
		<-next.done // the one fetch that may still run
	}()
	for {
		<-next.done
		if p.tooLarge(next.err) {
			next = l.fetch(ctx, p.req)
			continue
		}
		if next.err != nil {
			return 0, next.err
		}
		r := next.resp
		more := p.took(r)
		if more {
			next = l.fetch(ctx, p.req)
		}
		for _, kv := range r.Kvs {
			if err := fn(kv); err != nil {
				return 0, err
			}
		}
		if !more {
			return p.req.Revision, nil
		}
	}
}

// kvOverhead is about what a KeyValue takes in a Range response beside its
// key and value: its revisions, version, lease and field tags.
const kvOverhead = 32

// pager sizes the pages of one paged listing. After the first page, a page
// asks for as many keys as bytes holds at the mean size of the keys of the
// page before, at least as many as the first page and at most twice as
// many as the page before: a range whose keys grow large after small ones
// gets pages at most twice its first page's keys before they shrink back.
// Owned by pages.
type pager struct {
	*lister
	req   *pb.RangeRequest // the page asked for last
	bytes int64            // what a page aims at; 0: the first page's size
}

// took notes the page r, the answer to p.req, and reports whether there
// is more; if so, p.req is the next page.
func (p *pager) took(r *pb.RangeResponse) bool {
	if p.req.Revision == 0 { // the first page, read linearizably: the others are pinned to its revision
		p.req.Revision, p.cluster = r.GetHeader().GetRevision(), r.GetHeader().GetClusterId()
	}
	if !r.More || len(r.Kvs) == 0 {
		return false
	}
	last := r.Kvs[len(r.Kvs)-1].Key
	p.ask(append(last[:len(last):len(last)], 0), p.limit(r.Kvs)) // the next key after the last; fn may keep last
	return true
}

// ask makes p.req the page of limit keys from key on, at the same
// revision as the pages before.
func (p *pager) ask(key []byte, limit int64) {
	p.req = &pb.RangeRequest{Key: key, RangeEnd: p.req.RangeEnd, Limit: limit, Revision: p.req.Revision, KeysOnly: p.req.KeysOnly}
}

// limit is how many keys the page after kvs, the page p.req asked for,
// asks for.
func (p *pager) limit(kvs []*mvccpb.KeyValue) int64 {
	if p.bytes == 0 {
		return p.page
	}
	taken := int64(0)
	for _, kv := range kvs {
		taken += int64(len(kv.Key) + len(kv.Value) + kvOverhead)
	}
	mean := max(1, taken/int64(len(kvs)))
	return min(max(p.page, p.bytes/mean), 2*p.req.Limit)
}

// tooLarge reports whether err refuses a page grown past the first's size
// as above the Stream's receive limit (grpc.MaxCallRecvMsgSize). If so,
// p.req is that page again at the first's size, as are the pages after.
func (p *pager) tooLarge(err error) bool {
	if err == nil || p.req.Limit <= p.page || !rpcerr.TooLarge(err) {
		return false
	}
	p.bytes = 0
	p.ask(p.req.Key, p.page)
	return true
}

// page is one Range call of a paged listing, made by a goroutine of its own
// so that the lister can take the page before while the server reads it.
// resp and err are set before done closes.
type page struct {
	done chan struct{}
	resp *pb.RangeResponse
	err  error
}

// fetch calls Range for req. The call's goroutine exits when the call
// returns, which ctx bounds; pages waits for it before returning.
func (l *lister) fetch(ctx context.Context, req *pb.RangeRequest) *page {
	p := &page{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.resp, p.err = l.kv.Range(ctx, req, l.call...)
	}()
	return p
}
