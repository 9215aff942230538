package etcdwatch

import (
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// EventType is the kind of change an Event reports.
type EventType int32

const (
	Put    EventType = EventType(mvccpb.PUT)
	Delete EventType = EventType(mvccpb.DELETE)
)

// String returns "PUT", "DELETE" or "UNKNOWN".
func (t EventType) String() string {
	switch t {
	case Put:
		return "PUT"
	case Delete:
		return "DELETE"
	}
	return "UNKNOWN"
}

// KeyValue is a key and its value at one revision.
type KeyValue struct {
	Key, Value     []byte
	CreateRevision int64 // revision of the key's last creation
	ModRevision    int64 // revision of this change
	Version        int64 // number of changes since creation; 0 after a delete
	Lease          int64 // lease ID, 0 when none
}

// Event is one change of one key. For a Delete, KeyValue holds the key and
// the deletion's ModRevision. PrevKV is set when the watch asked for it and
// the server still had it.
type Event struct {
	Type EventType
	KeyValue
	PrevKV *KeyValue
}

// IsCreate reports whether the event created its key.
func (e Event) IsCreate() bool { return e.Type == Put && e.Version == 1 }

// IsModify reports whether the event changed an existing key.
func (e Event) IsModify() bool { return e.Type == Put && e.Version > 1 }

// Header is the response header as the server sent it. Its Revision is the
// store's revision when the message was sent, which can be far ahead of the
// events a catching-up watch has received: use Response.Revision instead.
type Header struct {
	ClusterID, MemberID uint64
	RaftTerm            uint64
	Revision            int64
}

// Response is one delivery to a watch: the events of one or more whole
// revisions in order, or, with no events, a progress bookmark. A consumer
// that keeps up gets the events of each message from the server (of each
// revision sent in fragments) in a Response of their own; for one that is
// behind, small responses waiting for it are joined, up to JoinLimit events to
// a Response, so that it catches up in fewer handovers. Bookmarks are never
// joined with events.
//
// A Response belongs to its consumer, who may keep and modify it. The key,
// value and previous key and value of one event share one buffer of that
// event's own (appending to one never changes another): keeping a key keeps
// that event's bytes alive, and nothing of the other events.
type Response struct {
	// Header is that of the last message whose events the Response carries.
	Header Header
	Events []Event
	// Revision promises that every event of this watch with a revision
	// <= Revision has now been delivered.
	Revision int64
}

// JoinLimit is the most events a Response joined from several, for a
// consumer that is behind, may carry; wings joining their own batches
// use it too.
const JoinLimit = 64

// IsProgress reports whether r is a bookmark, a response without events.
func (r Response) IsProgress() bool { return len(r.Events) == 0 }

// newerEvents keeps the events of src with ModRevision > after: appended to
// dst if dst holds earlier fragments of the revision, else in src itself,
// which the caller owns. It returns the events and how many it dropped
// that were not expected: those of revision again, asked for again, were.
func newerEvents(dst, src []Event, after, again int64) ([]Event, int) {
	if dst == nil {
		dst = src[:0]
	}
	skipped := 0
	for _, e := range src {
		if e.ModRevision <= after {
			if e.ModRevision != again {
				skipped++
			}
			continue
		}
		dst = append(dst, e)
	}
	return dst, skipped
}
