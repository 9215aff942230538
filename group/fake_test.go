package group_test

import (
	"strings"
	"sync"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// fake serves every Watch stream a group opens on the scripted server, as
// a small etcd would: it confirms creates at revision created, refusing
// those of keys under refused/ and holding those under slow/ until the
// test closes slow; answers cancels; and answers progress
// requests at the revisions its test gives each stream. It records what
// each stream was asked. Streams are numbered in the order they opened.
type fake struct {
	t      *testing.T
	server *ws.Server

	mu       sync.Mutex
	streams  []*fakeStream
	holdNext bool          // the next stream opened waits for release before answering
	slow     chan struct{} // creates of keys under slow/ wait until it is closed
	held     int           // creates of slow/ keys waiting for slow, over every stream
	changed  chan struct{} // closed, and replaced, at each change
	wg       sync.WaitGroup
}

// created is the header revision of every created response.
const created = 5

type fakeStream struct {
	st       *ws.Stream
	keys     []string         // keys of the creates answered, in order
	live     map[int64]string // watches confirmed and not canceled
	cancels  int
	ended    bool    // the client's side ended
	progress []int64 // answers to progress requests in turn; the last repeats
	asked    int     // progress requests received
	hold     chan struct{}
}

func serve(t *testing.T) *fake {
	f := &fake{t: t, server: ws.Start(t), changed: make(chan struct{}), slow: make(chan struct{})}
	ctx := t.Context()
	f.wg.Go(func() { // accepts until the test ends; the cleanup waits
		for {
			select {
			case st := <-f.server.Streams():
				f.mu.Lock()
				fs := &fakeStream{st: st, live: map[int64]string{}, progress: []int64{100}}
				if f.holdNext {
					fs.hold, f.holdNext = make(chan struct{}), false
				}
				f.streams = append(f.streams, fs)
				f.changedLocked()
				f.mu.Unlock()
				f.wg.Go(func() { f.serveStream(fs) }) // until the client ends the stream; the cleanup waits
			case <-ctx.Done():
				return
			}
		}
	})
	// After the group's Close (registered later, so run earlier): every
	// stream has ended by then.
	t.Cleanup(f.wg.Wait)
	return f
}

func (f *fake) changedLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fake) serveStream(fs *fakeStream) {
	defer func() {
		f.mu.Lock()
		fs.ended = true
		f.changedLocked()
		f.mu.Unlock()
	}()
	if fs.hold != nil {
		select {
		case <-fs.hold:
		case <-f.t.Context().Done():
			return
		}
	}
	for req := range fs.st.Requests() {
		if c := req.GetCreateRequest(); c != nil && strings.HasPrefix(string(c.Key), "slow/") {
			f.mu.Lock()
			f.held++
			f.changedLocked()
			f.mu.Unlock()
			select {
			case <-f.slow:
			case <-f.t.Context().Done():
				return
			}
		}
		f.mu.Lock()
		var resp *pb.WatchResponse
		switch {
		case req.GetCreateRequest() != nil:
			c := req.GetCreateRequest()
			if strings.HasPrefix(string(c.Key), "refused/") {
				resp = ws.CreateFailed("etcdserver: permission denied")
				break
			}
			fs.keys = append(fs.keys, string(c.Key))
			fs.live[c.WatchId] = string(c.Key)
			resp = ws.Created(c.WatchId, created)
		case req.GetCancelRequest() != nil:
			id := req.GetCancelRequest().WatchId
			if _, ok := fs.live[id]; ok {
				delete(fs.live, id)
				fs.cancels++
				resp = ws.Canceled(id)
			}
		case req.GetProgressRequest() != nil:
			fs.asked++
			rev := fs.progress[0]
			if len(fs.progress) > 1 {
				fs.progress = fs.progress[1:]
			}
			resp = ws.Progress(-1, rev)
		}
		f.changedLocked()
		f.mu.Unlock()
		if resp != nil {
			fs.st.Send(f.t, resp)
		}
	}
}

// await waits until cond, called with the fake's lock held, holds.
func (f *fake) await(cond func() bool, msg string) {
	f.t.Helper()
	deadline := timeout()
	for {
		f.mu.Lock()
		ok, changed := cond(), f.changed
		f.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			f.t.Fatalf("fake: %s: not within %v", msg, ws.Timeout)
		}
	}
}

// stream returns stream i once it has opened.
func (f *fake) stream(i int) *fakeStream {
	f.t.Helper()
	var fs *fakeStream
	f.await(func() bool {
		if len(f.streams) > i {
			fs = f.streams[i]
		}
		return fs != nil
	}, "stream not opened")
	return fs
}

// keysOf returns the keys stream i has confirmed.
func (f *fake) keysOf(i int) []string {
	fs := f.stream(i)
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), fs.keys...)
}

// opened returns how many streams have opened.
func (f *fake) opened() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.streams)
}

// answer sets the answers of stream i to progress requests.
func (f *fake) answer(i int, revs ...int64) {
	fs := f.stream(i)
	f.mu.Lock()
	defer f.mu.Unlock()
	fs.progress = revs
}

// holding waits until n creates of slow/ keys are held, over every stream.
func (f *fake) holding(n int) { f.await(func() bool { return f.held >= n }, "slow creates held") }

// release lets a held stream answer.
func (f *fake) release(i int) { close(f.stream(i).hold) }
