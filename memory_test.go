package etcdwatch_test

import (
	"runtime"
	"strings"
	"testing"
	"weak"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// liveHeap returns the bytes of live heap objects. Two collections: objects
// in sync.Pools (gRPC's buffers) survive the first.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// bigResponse is a response of n events at rev, each with a value of size bytes.
func bigResponse(id, rev int64, n, size int) *pb.WatchResponse {
	r := ws.Events(id, rev)
	for i := range n {
		r.Events = append(r.Events, ws.Put(strings.Repeat("k", 8)+string(rune('a'+i%26)), strings.Repeat("v", size), rev))
	}
	return r
}

// TestKeptKeyKeepsOnlyItsEvent: a consumer that keeps one key from each of
// many large responses, as a cache does, keeps those events' bytes alive,
// not whole responses.
func TestKeptKeyKeepsOnlyItsEvent(t *testing.T) {
	const responses, events, size = 32, 32, 32 << 10 // 32 MiB in all, 1 MiB kept
	h := newHarness(t)
	w := h.watch(etcdwatch.Prefix("k"), 1)
	before := liveHeap()
	kept := make([][]byte, 0, responses)
	for rev := int64(2); rev < 2+responses; rev++ {
		h.srv.Send(t, bigResponse(w.ID(), rev, events, size))
		for _, e := range next(t, w).Events {
			if len(kept) < int(rev-1) {
				kept = append(kept, e.Key)
			}
		}
	}
	after := liveHeap()
	grew := int64(after) - int64(before)
	t.Logf("kept %d keys; live heap grew %d KiB", len(kept), grew>>10)
	// One event's bytes are about size; a response's, events times that.
	require.Less(t, grew, int64(4*responses*size), "keeping a key keeps more than its event")
	runtime.KeepAlive(kept)
}

// TestDrainedBacklogHoldsNoResponse: once a consumer that fell behind has
// read its whole backlog and dropped what it read, nothing in the Stream
// keeps a response alive.
func TestDrainedBacklogHoldsNoResponse(t *testing.T) {
	const n = 200
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 1)
	for rev := int64(2); rev < 2+n; rev++ { // read by nobody yet: a backlog
		events := 1 + int(rev)%3 // joined while they wait
		if rev == 1+n {
			events = 100 // too many to join: the consumer gets the decoded events themselves
		}
		h.srv.Send(t, bigResponse(w.ID(), rev, events, 1<<10))
	}
	// The last message the Stream receives is one of these: nothing comes
	// after it to take its place in a buffer that outlives it.
	var refs []weak.Pointer[etcdwatch.Event]
	for got := int64(1); got < 1+n; {
		r := next(t, w)
		got = r.Revision
		refs = append(refs, weak.Make(&r.Events[0]))
	}
	liveHeap()
	for i, ref := range refs {
		require.Nil(t, ref.Value(), "response %d of %d is still reachable", i+1, len(refs))
	}
}
