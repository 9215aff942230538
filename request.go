package etcdwatch

import (
	"bytes"
	"fmt"
)

// Request describes one watch: which keys, from which revision, and which
// events. Build one with Key, Prefix, Range or FromKey and refine it with the
// With and From methods; they return copies, so a Request can be reused.
// The zero Request is invalid (it names no key).
type Request struct {
	// Key is the first key watched. The empty key is etcd's smallest key.
	Key []byte
	// End is the end of the range, exclusive. nil watches Key alone;
	// "\x00" watches every key >= Key; otherwise End must sort after Key.
	End []byte
	// Revision is the first revision to deliver; 0 means "from now".
	Revision int64
	// PrevKV asks for each event's previous key-value.
	PrevKV bool
	// NoPut and NoDelete filter out puts or deletes. Both together make a
	// watch of bookmarks alone: the answers to RequestProgress and, with
	// ProgressNotify, the server's own, a heartbeat of the store's
	// revision. etcd sends such a watch no event, however large.
	NoPut, NoDelete bool
	// ProgressNotify asks the server for periodic bookmarks on an idle watch.
	ProgressNotify bool
	// Fragment lets the server split a huge revision into several messages;
	// the watch joins them again, so Responses never hold half a revision.
	Fragment bool
	// Isolated puts the watch on a gRPC stream apart from the Stream's
	// other watches, shared only with other isolated watches: etcd answers
	// a progress request once every watch on its gRPC stream has caught
	// up, so Watch.RequestProgress on an isolated watch waits for none of
	// the others, however far behind (or ahead, at a future revision)
	// they are. Views use it. The server does not see it.
	Isolated bool
}

// Key watches one key.
func Key(key string) Request { return Request{Key: []byte(key)} }

// Prefix watches every key that starts with prefix. The empty prefix
// watches every key.
func Prefix(prefix string) Request {
	if prefix == "" {
		return FromKey("")
	}
	return Request{Key: []byte(prefix), End: prefixEnd([]byte(prefix))}
}

// Range watches the keys in [start, end).
func Range(start, end string) Request { return Request{Key: []byte(start), End: []byte(end)} }

// FromKey watches every key >= key.
func FromKey(key string) Request {
	k := []byte(key)
	if len(k) == 0 {
		k = []byte{0}
	}
	return Request{Key: k, End: []byte{0}}
}

// FromRevision returns r starting at revision rev.
func (r Request) FromRevision(rev int64) Request { r.Revision = rev; return r }

// WithPrevKV returns r with previous key-values requested.
func (r Request) WithPrevKV() Request { r.PrevKV = true; return r }

// WithoutPuts returns r with put events filtered out.
func (r Request) WithoutPuts() Request { r.NoPut = true; return r }

// WithoutDeletes returns r with delete events filtered out.
func (r Request) WithoutDeletes() Request { r.NoDelete = true; return r }

// WithProgressNotify returns r with periodic server bookmarks requested.
func (r Request) WithProgressNotify() Request { r.ProgressNotify = true; return r }

// WithFragment returns r allowing the server to fragment huge revisions.
func (r Request) WithFragment() Request { r.Fragment = true; return r }

// Validate reports why the server would refuse r, or why r's range holds
// no key. Errors wrap ErrInvalidRequest and name the field.
func (r Request) Validate() error {
	switch {
	case len(r.Key) == 0 && r.End == nil:
		return fmt.Errorf("%w: Key is empty (use FromKey(\"\") to watch every key)", ErrInvalidRequest)
	case r.End != nil && !isFromKey(r.End) && bytes.Compare(r.End, r.Key) <= 0:
		return fmt.Errorf("%w: End %q must sort after Key %q (or be \"\\x00\")", ErrInvalidRequest, r.End, r.Key)
	case r.Revision < 0:
		return fmt.Errorf("%w: Revision %d is negative", ErrInvalidRequest, r.Revision)
	}
	return nil
}

// String describes the watched range for logs.
func (r Request) String() string {
	switch {
	case r.End == nil:
		return fmt.Sprintf("key %q", r.Key)
	case isFromKey(r.End):
		return fmt.Sprintf("keys >= %q", r.Key)
	default:
		return fmt.Sprintf("keys [%q, %q)", r.Key, r.End)
	}
}

func isFromKey(end []byte) bool { return len(end) == 1 && end[0] == 0 }

// prefixEnd returns the smallest key greater than every key with prefix p,
// or "\x00" (every key) when p is all 0xff bytes.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}
