package etcdwatch

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// encoded is r as a server decodes it.
func encoded(t testing.TB, r *wireRequest) *pb.WatchRequest {
	t.Helper()
	var m pb.WatchRequest
	if err := proto.Unmarshal(r.encode(), &m); err != nil {
		t.Fatalf("encode %+v: %v", r, err)
	}
	return &m
}

// createPB is the create request generic protobuf would send for r.
func createPB(r Request, id, start int64) *pb.WatchRequest {
	c := &pb.WatchCreateRequest{Key: r.Key, RangeEnd: r.End, StartRevision: start, ProgressNotify: r.ProgressNotify,
		PrevKv: r.PrevKV, Fragment: r.Fragment, WatchId: id}
	if r.NoPut {
		c.Filters = append(c.Filters, pb.WatchCreateRequest_NOPUT)
	}
	if r.NoDelete {
		c.Filters = append(c.Filters, pb.WatchCreateRequest_NODELETE)
	}
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}}
}

// packedOf returns r packed, as a Watch keeps it.
func packedOf(r Request) *packed {
	p := pack(r)
	return &p
}

// TestEncode: requests are byte for byte what generic protobuf writes.
func TestEncode(t *testing.T) {
	every := Prefix("p").WithPrevKV().WithProgressNotify().WithFragment().WithoutDeletes().FromRevision(1 << 40)
	for _, tc := range []struct {
		r    wireRequest
		want *pb.WatchRequest
	}{
		{wireRequest{kind: requestCreate, id: 1, watch: packedOf(Request{Key: []byte("k")})}, createPB(Key("k"), 1, 0)},
		{wireRequest{kind: requestCreate, id: 300, start: 7, watch: packedOf(every)}, createPB(every, 300, 7)},
		{wireRequest{kind: requestCreate, id: 2, watch: packedOf(Request{End: []byte{0}, NoPut: true})}, createPB(Request{End: []byte{0}, NoPut: true}, 2, 0)},
		{wireRequest{kind: requestCancel, id: 9}, &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: 9}}}},
		{wireRequest{kind: requestCancel, id: 0}, &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{}}}},
		{wireRequest{kind: requestProgress}, &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}},
	} {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(tc.want)
		if err != nil {
			t.Fatal(err)
		}
		if got := tc.r.encode(); !bytes.Equal(got, want) {
			t.Errorf("encode(%v)\n got %x\nwant %x", tc.want, got, want)
		}
	}
}

// FuzzEncode: any create request round-trips through protobuf.
func FuzzEncode(f *testing.F) {
	f.Add([]byte("k"), []byte(""), int64(0), int64(1), uint8(0))
	f.Add([]byte(""), []byte{0}, int64(1<<62), int64(-1), uint8(0xff))
	f.Fuzz(func(t *testing.T, key, end []byte, start, id int64, flags uint8) {
		r := Request{Key: key, End: end, PrevKV: flags&1 != 0, NoPut: flags&2 != 0, NoDelete: flags&4 != 0,
			ProgressNotify: flags&8 != 0, Fragment: flags&16 != 0}
		want, err := proto.Marshal(createPB(r, id, start))
		if err != nil {
			t.Fatal(err)
		}
		if got := (&wireRequest{kind: requestCreate, id: id, start: start, watch: packedOf(r)}).encode(); !bytes.Equal(got, want) {
			t.Fatalf("encode differs from protobuf\n got %x\nwant %x", got, want)
		}
	})
}

// decoded serializes resp as a server would and decodes it as the Stream does.
func decoded(t testing.TB, resp *pb.WatchResponse) *wireResponse {
	t.Helper()
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var r wireResponse
	if err := r.decode(b); err != nil {
		t.Fatalf("decode %v: %v", resp, err)
	}
	return &r
}

// fromPB is what decode must produce for m: the generic decoder's result in
// this package's types.
func fromPB(m *pb.WatchResponse) wireResponse {
	r := wireResponse{
		WatchID: m.WatchId, Created: m.Created, Canceled: m.Canceled,
		CompactRevision: m.CompactRevision, CancelReason: m.CancelReason, Fragment: m.Fragment,
	}
	if h := m.Header; h != nil {
		r.Header = Header{ClusterID: h.ClusterId, MemberID: h.MemberId, RaftTerm: h.RaftTerm, Revision: h.Revision}
	}
	kvOf := func(kv *mvccpb.KeyValue) KeyValue {
		if kv == nil {
			return KeyValue{}
		}
		return KeyValue{Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision,
			ModRevision: kv.ModRevision, Version: kv.Version, Lease: kv.Lease}
	}
	for _, e := range m.Events {
		ev := Event{}
		if e != nil {
			ev = Event{Type: EventType(e.Type), KeyValue: kvOf(e.Kv)}
			if e.PrevKv != nil {
				prev := kvOf(e.PrevKv)
				ev.PrevKV = &prev
			}
		}
		r.Events = append(r.Events, ev)
	}
	return r
}

func equalKV(a, b KeyValue) bool {
	return bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value) && a.CreateRevision == b.CreateRevision &&
		a.ModRevision == b.ModRevision && a.Version == b.Version && a.Lease == b.Lease
}

func equalResponses(a, b wireResponse) bool {
	if a.Header != b.Header || a.WatchID != b.WatchID || a.Created != b.Created || a.Canceled != b.Canceled ||
		a.CompactRevision != b.CompactRevision || a.CancelReason != b.CancelReason || a.Fragment != b.Fragment ||
		len(a.Events) != len(b.Events) {
		return false
	}
	for i := range a.Events {
		x, y := a.Events[i], b.Events[i]
		if x.Type != y.Type || !equalKV(x.KeyValue, y.KeyValue) || (x.PrevKV == nil) != (y.PrevKV == nil) ||
			(x.PrevKV != nil && !equalKV(*x.PrevKV, *y.PrevKV)) {
			return false
		}
	}
	return true
}

func kv(key, value string, rev int64) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), CreateRevision: 2, ModRevision: rev, Version: 3, Lease: 7}
}

// decodeCases are responses of every kind a server sends.
var decodeCases = []*pb.WatchResponse{
	{},
	{Header: &pb.ResponseHeader{ClusterId: 1 << 63, MemberId: 2, Revision: 99, RaftTerm: 4}, WatchId: 5, Created: true},
	{WatchId: -1, Created: true, Canceled: true, CancelReason: "etcdserver: permission denied"},
	{WatchId: 3, Canceled: true, CompactRevision: 40},
	{WatchId: -1, Header: &pb.ResponseHeader{Revision: 12}},
	{WatchId: 3, Fragment: true, Events: []*mvccpb.Event{{Kv: kv("a", "1", 9)}}},
	{WatchId: 3, Events: []*mvccpb.Event{
		{Kv: kv("a", "1", 9)},
		{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte("b"), ModRevision: 9}, PrevKv: kv("b", "old", 8)},
		{Kv: kv("c", "", 10), PrevKv: &mvccpb.KeyValue{}},
		{},
	}},
}

func TestDecode(t *testing.T) {
	for _, m := range decodeCases {
		got, want := *decoded(t, m), fromPB(m)
		if !equalResponses(got, want) {
			t.Errorf("decode(%v)\n got %+v\nwant %+v", m, got, want)
		}
	}
}

// TestDecodeKeepsNoBufferAlias: keys and values are copies, since gRPC reuses
// the buffer, and appending to one cannot overwrite the next.
func TestDecodeKeepsNoBufferAlias(t *testing.T) {
	b, err := proto.Marshal(decodeCases[len(decodeCases)-1])
	if err != nil {
		t.Fatal(err)
	}
	var r wireResponse
	if err := r.decode(b); err != nil {
		t.Fatal(err)
	}
	clear(b)
	if string(r.Events[0].Key) != "a" || string(r.Events[1].PrevKV.Value) != "old" {
		t.Fatalf("decoded events changed with the buffer: %+v", r.Events)
	}
	_ = append(r.Events[0].Key, 'x')
	if string(r.Events[0].Value) != "1" {
		t.Fatalf("appending to a key overwrote its value: %q", r.Events[0].Value)
	}
}

func TestDecodeMalformed(t *testing.T) {
	good, err := proto.Marshal(decodeCases[len(decodeCases)-1])
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"truncated":        good[:len(good)-1],
		"bad tag":          {0x80},
		"field 0":          protowire.AppendTag(nil, 0, protowire.VarintType),
		"length past end":  {byte(fieldRespEvents<<3 | 2), 5, 1},
		"reason not UTF-8": protowire.AppendBytes(protowire.AppendTag(nil, fieldRespCancelReason, protowire.BytesType), []byte{0xff}),
	} {
		var r wireResponse
		if err := r.decode(b); !errors.Is(err, errMalformed) {
			t.Errorf("%s: decode err = %v, want errMalformed", name, err)
		}
	}
}

// TestDecodeAllocations: one allocation per response with events (the
// events), one per event with bytes (its key and values), one more per
// PrevKV, none without events.
func TestDecodeAllocations(t *testing.T) {
	for _, tc := range []struct {
		m    *pb.WatchResponse
		want float64
	}{
		{decodeCases[1], 0},
		{&pb.WatchResponse{WatchId: 3, Events: []*mvccpb.Event{{Kv: kv("a", "1", 9)}, {Kv: kv("b", "2", 9)}}}, 3},
		{decodeCases[len(decodeCases)-1], 6}, // 4 events, one empty, two with PrevKV
	} {
		b, err := proto.Marshal(tc.m)
		if err != nil {
			t.Fatal(err)
		}
		var r wireResponse
		if got := testing.AllocsPerRun(100, func() { _ = r.decode(b) }); got != tc.want {
			t.Errorf("decode(%v): %v allocations, want %v", tc.m, got, tc.want)
		}
	}
}

// FuzzDecode checks decode against the generic protobuf decoder on any
// bytes: both accept or both refuse, and what they accept is the same.
func FuzzDecode(f *testing.F) {
	for _, m := range decodeCases {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want pb.WatchResponse
		wantErr := proto.Unmarshal(b, &want)
		var got wireResponse
		err := got.decode(b)
		switch {
		case wantErr != nil && err == nil:
			t.Fatalf("decode accepted what protobuf refuses (%v): %+v", wantErr, got)
		case wantErr == nil && err != nil:
			t.Fatalf("decode refused what protobuf accepts (%v): %v", &want, err)
		case err == nil && !equalResponses(got, fromPB(&want)):
			t.Fatalf("decode differs from protobuf\n got %+v\nwant %v", got, &want)
		}
	})
}

// BenchmarkDecode compares decode with generic protobuf decoding on
// responses of 1 and 100 events (32-byte keys and values).
func BenchmarkDecode(b *testing.B) {
	for _, per := range []int{1, 100} {
		m := &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: 9}, WatchId: 3}
		for i := range per {
			m.Events = append(m.Events, &mvccpb.Event{Kv: &mvccpb.KeyValue{
				Key: fmt.Appendf(nil, "key-%027d", i), Value: fmt.Appendf(nil, "value-%025d", i),
				CreateRevision: 2, ModRevision: 9, Version: 3}})
		}
		data, err := proto.Marshal(m)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("events=%d/etcdwatch", per), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var r wireResponse
				if err := r.decode(data); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("events=%d/protobuf", per), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var r pb.WatchResponse
				if err := proto.Unmarshal(data, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
