package etcdwatch

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// EventType is the kind of change an Event reports.
type EventType int32

const (
	Put    EventType = EventType(mvccpb.PUT)
	Delete EventType = EventType(mvccpb.DELETE)
)

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
// revisions in order, or, with no events, a progress bookmark.
type Response struct {
	Header Header
	Events []Event
	// Revision promises that every event of this watch with a revision
	// <= Revision has now been delivered.
	Revision int64
}

// IsProgress reports whether r is a bookmark, a response without events.
func (r Response) IsProgress() bool { return len(r.Events) == 0 }

func headerOf(h *pb.ResponseHeader) Header {
	if h == nil {
		return Header{}
	}
	return Header{ClusterID: h.ClusterId, MemberID: h.MemberId, RaftTerm: h.RaftTerm, Revision: h.Revision}
}

func keyValueOf(kv *mvccpb.KeyValue) KeyValue {
	if kv == nil {
		return KeyValue{}
	}
	return KeyValue{
		Key: kv.Key, Value: kv.Value,
		CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision,
		Version: kv.Version, Lease: kv.Lease,
	}
}

// appendEvents converts the wire events with ModRevision > after and appends
// them to dst. It returns dst and how many events it skipped.
func appendEvents(dst []Event, src []*mvccpb.Event, after int64) ([]Event, int) {
	skipped := 0
	for _, e := range src {
		if e == nil || e.Kv == nil || e.Kv.ModRevision <= after {
			skipped++
			continue
		}
		ev := Event{Type: EventType(e.Type), KeyValue: keyValueOf(e.Kv)}
		if e.PrevKv != nil {
			prev := keyValueOf(e.PrevKv)
			ev.PrevKV = &prev
		}
		dst = append(dst, ev)
	}
	return dst, skipped
}
