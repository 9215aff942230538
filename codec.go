package etcdwatch

import (
	"errors"
	"fmt"
	"iter"
	"unicode/utf8"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// wireResponse is an etcdserverpb.WatchResponse decoded straight into this
// package's types: its events are the ones handed to consumers, and each
// event's key, value and previous key and value share one copy of that
// event's bytes, so that keeping one key keeps no other event alive.
// Generic protobuf decoding costs four allocations per event and a
// reflective walk of each; this costs one per response and one per event
// (two with PrevKV), and none for a response without events.
type wireResponse struct {
	Header          Header
	WatchID         int64
	Created         bool
	Canceled        bool
	CompactRevision int64
	CancelReason    string
	Fragment        bool
	Events          []Event
	size            int // of the message, for the session's read-ahead bound
}

// GetCanceled, GetCancelReason and GetHeader are the getters of etcd's
// generated WatchResponse, so that a stream interceptor on the connection
// (package dial's auth, say) reads a Stream's responses as it reads the
// generated client's.
func (r *wireResponse) GetCanceled() bool       { return r.Canceled }
func (r *wireResponse) GetCancelReason() string { return r.CancelReason }
func (r *wireResponse) GetHeader() *pb.ResponseHeader {
	h := r.Header
	return &pb.ResponseHeader{ClusterId: h.ClusterID, MemberId: h.MemberID, RaftTerm: h.RaftTerm, Revision: h.Revision}
}

// Field numbers of the messages in etcd's rpc.proto and kv.proto.
const (
	fieldRespHeader          = 1
	fieldRespWatchID         = 2
	fieldRespCreated         = 3
	fieldRespCanceled        = 4
	fieldRespCompactRevision = 5
	fieldRespCancelReason    = 6
	fieldRespFragment        = 7
	fieldRespEvents          = 11

	fieldHeaderClusterID = 1
	fieldHeaderMemberID  = 2
	fieldHeaderRevision  = 3
	fieldHeaderRaftTerm  = 4

	fieldEventType   = 1
	fieldEventKV     = 2
	fieldEventPrevKV = 3

	fieldKVKey            = 1
	fieldKVCreateRevision = 2
	fieldKVModRevision    = 3
	fieldKVVersion        = 4
	fieldKVValue          = 5
	fieldKVLease          = 6
)

var errMalformed = errors.New("etcdwatch: malformed WatchResponse")

// decoder copies the keys and values of one event into arena, since gRPC
// reuses the message's buffer once Unmarshal returns.
type decoder struct {
	arena []byte // made for each event, sized for all its byte fields
}

// decode parses b, a serialized WatchResponse, into r. Fields are handled
// as protobuf does: unknown ones are skipped, a repeated singular field
// merges into the earlier one, and the last value of a scalar wins.
func (r *wireResponse) decode(b []byte) error {
	*r = wireResponse{size: len(b)}
	n, err := countEvents(b)
	if err != nil {
		return err
	}
	var d decoder
	if n > 0 {
		r.Events = make([]Event, 0, n)
	}
	for f := range fields(b) { // countEvents has checked every field
		switch {
		case f.typ == protowire.BytesType && f.num == fieldRespHeader:
			if err := r.Header.decode(f.s); err != nil {
				return err
			}
		case f.typ == protowire.BytesType && f.num == fieldRespCancelReason:
			if !utf8.Valid(f.s) {
				return fmt.Errorf("%w: cancel_reason is not UTF-8", errMalformed)
			}
			r.CancelReason = string(f.s)
		case f.typ == protowire.BytesType && f.num == fieldRespEvents:
			r.Events = append(r.Events, Event{})
			if err := d.event(&r.Events[len(r.Events)-1], f.s); err != nil {
				return err
			}
		case f.typ != protowire.VarintType:
		case f.num == fieldRespWatchID:
			r.WatchID = int64(f.v)
		case f.num == fieldRespCreated:
			r.Created = f.v != 0
		case f.num == fieldRespCanceled:
			r.Canceled = f.v != 0
		case f.num == fieldRespCompactRevision:
			r.CompactRevision = int64(f.v)
		case f.num == fieldRespFragment:
			r.Fragment = f.v != 0
		}
	}
	return nil
}

// countEvents returns how many events b holds, and checks b's fields.
func countEvents(b []byte) (n int, err error) {
	for f, err := range fields(b) {
		if err != nil {
			return 0, err
		}
		if f.num == fieldRespEvents && f.typ == protowire.BytesType {
			n++
		}
	}
	return n, nil
}

func (h *Header) decode(b []byte) error {
	for f, err := range fields(b) {
		if err != nil {
			return err
		}
		if f.typ != protowire.VarintType {
			continue
		}
		switch f.num {
		case fieldHeaderClusterID:
			h.ClusterID = f.v
		case fieldHeaderMemberID:
			h.MemberID = f.v
		case fieldHeaderRevision:
			h.Revision = int64(f.v)
		case fieldHeaderRaftTerm:
			h.RaftTerm = f.v
		}
	}
	return nil
}

// event decodes an mvccpb.Event into e. Its byte fields go to an arena of
// its own, as large as the event's encoding: room for all of them.
func (d *decoder) event(e *Event, b []byte) error {
	d.arena = make([]byte, 0, len(b))
	for f, err := range fields(b) {
		if err != nil {
			return err
		}
		switch {
		case f.num == fieldEventType && f.typ == protowire.VarintType:
			e.Type = EventType(int32(f.v))
		case f.num == fieldEventKV && f.typ == protowire.BytesType:
			err = d.keyValue(&e.KeyValue, f.s)
		case f.num == fieldEventPrevKV && f.typ == protowire.BytesType:
			if e.PrevKV == nil {
				e.PrevKV = new(KeyValue) // its own, so that keeping it keeps no other event
			}
			err = d.keyValue(e.PrevKV, f.s)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// keyValue decodes an mvccpb.KeyValue into kv.
func (d *decoder) keyValue(kv *KeyValue, b []byte) error {
	for f, err := range fields(b) {
		if err != nil {
			return err
		}
		switch {
		case f.typ == protowire.BytesType && f.num == fieldKVKey:
			kv.Key = d.copy(f.s)
		case f.typ == protowire.BytesType && f.num == fieldKVValue:
			kv.Value = d.copy(f.s)
		case f.typ != protowire.VarintType:
		case f.num == fieldKVCreateRevision:
			kv.CreateRevision = int64(f.v)
		case f.num == fieldKVModRevision:
			kv.ModRevision = int64(f.v)
		case f.num == fieldKVVersion:
			kv.Version = int64(f.v)
		case f.num == fieldKVLease:
			kv.Lease = int64(f.v)
		}
	}
	return nil
}

// copy returns s copied into the arena, capacity-limited so that a
// consumer's append cannot reach its neighbour; nil when s is empty.
func (d *decoder) copy(s []byte) []byte {
	if len(s) == 0 {
		return nil
	}
	start := len(d.arena)
	d.arena = append(d.arena, s...) // the arena was sized for every byte field of the event: no reallocation
	return d.arena[start:len(d.arena):len(d.arena)]
}

// field is one field of a message: v for a varint, s for a length-delimited
// field; the value of any other type is skipped.
type field struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	s   []byte
}

// fields yields the fields of the message b in order; a malformed one ends
// the walk, yielded with its error.
func fields(b []byte) iter.Seq2[field, error] {
	return func(yield func(field, error) bool) {
		for len(b) > 0 {
			f, rest, err := nextField(b)
			if !yield(f, err) || err != nil {
				return
			}
			b = rest
		}
	}
}

// nextField parses the first field of b and returns it and the rest of b.
func nextField(b []byte) (f field, rest []byte, err error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return f, nil, fmt.Errorf("%w: %v", errMalformed, protowire.ParseError(n))
	}
	if num > protowire.MaxValidNumber { // ConsumeTag checks only the lower bound
		return f, nil, fmt.Errorf("%w: field number %d", errMalformed, num)
	}
	f.num, f.typ = num, typ
	b = b[n:]
	switch typ {
	case protowire.VarintType:
		f.v, n = protowire.ConsumeVarint(b)
	case protowire.BytesType:
		f.s, n = protowire.ConsumeBytes(b)
	default:
		n = protowire.ConsumeFieldValue(num, typ, b)
	}
	if n < 0 {
		return f, nil, fmt.Errorf("%w: field %d: %v", errMalformed, num, protowire.ParseError(n))
	}
	return f, b[n:], nil
}

// requestKind says which of etcd's three watch requests a wireRequest is.
type requestKind uint8

const (
	requestCreate requestKind = iota + 1
	requestCancel
	requestProgress
)

// wireRequest is an etcdserverpb.WatchRequest as the dispatcher queues it;
// the codec encodes it without building the generated messages.
type wireRequest struct {
	kind  requestKind
	id    int64   // create: the id asked for; cancel: the watch to cancel
	start int64   // create: the first revision, 0 for "from now"
	watch *packed // create: what to watch; its Watch's, never modified
}

// Field numbers of WatchRequest and the requests it carries.
const (
	fieldReqCreate   = 1
	fieldReqCancel   = 2
	fieldReqProgress = 3

	fieldCreateKey            = 1
	fieldCreateRangeEnd       = 2
	fieldCreateStartRevision  = 3
	fieldCreateProgressNotify = 4
	fieldCreateFilters        = 5 // packed enums: NOPUT = 0, NODELETE = 1
	fieldCreatePrevKV         = 6
	fieldCreateWatchID        = 7
	fieldCreateFragment       = 8

	fieldCancelWatchID = 1
)

// encode returns r serialized as protobuf would: fields in number order,
// zero values left out.
func (r *wireRequest) encode() []byte {
	switch r.kind {
	case requestCreate:
		inner := r.createSize()
		b := make([]byte, 0, createMessageSize(inner))
		b = protowire.AppendTag(b, fieldReqCreate, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(inner))
		return r.appendCreate(b)
	case requestCancel:
		var inner []byte
		inner = appendVarintField(inner, fieldCancelWatchID, uint64(r.id))
		b := protowire.AppendTag(make([]byte, 0, 2+len(inner)), fieldReqCancel, protowire.BytesType)
		return protowire.AppendBytes(b, inner)
	default:
		return protowire.AppendBytes(protowire.AppendTag(nil, fieldReqProgress, protowire.BytesType), nil)
	}
}

// filters returns the packed filter list of a create, in encoded form.
func (r *wireRequest) filters() (f [2]byte, n int) {
	if r.watch.has(optNoPut) {
		f[n], n = 0, n+1 // NOPUT
	}
	if r.watch.has(optNoDelete) {
		f[n], n = 1, n+1 // NODELETE
	}
	return f, n
}

func (r *wireRequest) appendCreate(b []byte) []byte {
	w := r.watch
	b = appendBytesField(b, fieldCreateKey, w.key())
	b = appendBytesField(b, fieldCreateRangeEnd, w.end())
	b = appendVarintField(b, fieldCreateStartRevision, uint64(r.start))
	b = appendVarintField(b, fieldCreateProgressNotify, protowire.EncodeBool(w.has(optProgressNotify)))
	if f, n := r.filters(); n > 0 {
		b = appendBytesField(b, fieldCreateFilters, f[:n])
	}
	b = appendVarintField(b, fieldCreatePrevKV, protowire.EncodeBool(w.has(optPrevKV)))
	b = appendVarintField(b, fieldCreateWatchID, uint64(r.id))
	return appendVarintField(b, fieldCreateFragment, protowire.EncodeBool(w.has(optFragment)))
}

// createMessageSize is the size of a WatchRequest carrying a create whose
// own encoding (createSize) takes inner bytes.
func createMessageSize(inner int) int {
	return protowire.SizeTag(fieldReqCreate) + protowire.SizeBytes(inner)
}

func (r *wireRequest) createSize() int {
	w := r.watch
	n := bytesFieldSize(fieldCreateKey, len(w.key())) + bytesFieldSize(fieldCreateRangeEnd, len(w.end())) +
		varintFieldSize(fieldCreateStartRevision, uint64(r.start)) +
		varintFieldSize(fieldCreateProgressNotify, protowire.EncodeBool(w.has(optProgressNotify))) +
		varintFieldSize(fieldCreatePrevKV, protowire.EncodeBool(w.has(optPrevKV))) +
		varintFieldSize(fieldCreateWatchID, uint64(r.id)) +
		varintFieldSize(fieldCreateFragment, protowire.EncodeBool(w.has(optFragment)))
	if _, k := r.filters(); k > 0 {
		n += bytesFieldSize(fieldCreateFilters, k)
	}
	return n
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendBytesField[B string | []byte](b []byte, num protowire.Number, v B) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.BytesType), uint64(len(v)))
	return append(b, v...)
}

func varintFieldSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func bytesFieldSize(num protowire.Number, n int) int {
	if n == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

// codec is the gRPC codec of the Watch RPC, forced on it alone: it encodes
// wireRequest and decodes into wireResponse, the only messages the RPC
// carries.
type codec struct{}

// Name is the content-subtype: the one every etcd server registers.
func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*wireRequest)
	if !ok {
		return nil, fmt.Errorf("etcdwatch: codec cannot encode %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(r.encode())}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*wireResponse)
	if !ok {
		return fmt.Errorf("etcdwatch: codec cannot decode into %T", v)
	}
	if len(data) > 1 && data.Len() > pooledMax {
		// Decoded once and dropped: a pooled buffer this large would stay
		// in gRPC's pool, for messages this large are rare.
		return r.decode(data.Materialize())
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return r.decode(buf.ReadOnlyData())
}

// pooledMax is the largest message whose pieces are joined in a buffer from
// gRPC's pool. etcd sends up to 1,000 revisions in one message while a watch
// catches up, tens of MiB; a buffer of that size returned to the pool would
// be kept, unused, until the garbage collector empties the pool.
const pooledMax = 1 << 20
