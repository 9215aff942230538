package etcdwatch

// This file checks the hand-written codec against the generated
// etcdserverpb and mvccpb code: what protobuf accepts, the codec decodes to
// the same fields (unknown fields of every wire type skipped, repeated
// messages merged, the last scalar kept); what protobuf refuses, the codec
// refuses; and every request the Stream sends is protobuf's, byte for byte.

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// extremes are the int64 values at the edges of the varint encodings.
var extremes = []int64{0, 1, -1, 127, 128, math.MaxInt64, math.MinInt64, math.MaxInt32, math.MinInt32, 1 << 40, -(1 << 40)}

func rInt64(r *rand.Rand) int64 {
	switch r.IntN(3) {
	case 0:
		return extremes[r.IntN(len(extremes))]
	case 1:
		return int64(r.Uint64())
	default:
		return int64(r.IntN(1000))
	}
}

func rBytes(r *rand.Rand) []byte {
	if r.IntN(4) == 0 {
		return nil
	}
	b := make([]byte, r.IntN(40))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// rUnknown returns random unknown fields (numbers no etcd message uses,
// every wire type, nested groups), as a newer etcd might add.
func rUnknown(r *rand.Rand) protoreflect.RawFields {
	var b []byte
	for range r.IntN(3) {
		num := protowire.Number(20 + r.IntN(1000))
		if r.IntN(5) == 0 {
			num = protowire.MaxValidNumber - protowire.Number(r.IntN(3))
		}
		switch r.IntN(5) {
		case 0:
			b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), r.Uint64())
		case 1:
			b = protowire.AppendFixed32(protowire.AppendTag(b, num, protowire.Fixed32Type), r.Uint32())
		case 2:
			b = protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), r.Uint64())
		case 3:
			b = protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), rBytes(r))
		case 4:
			b = protowire.AppendTag(b, num, protowire.StartGroupType)
			b = protowire.AppendVarint(protowire.AppendTag(b, 1, protowire.VarintType), r.Uint64())
			b = protowire.AppendTag(b, 2, protowire.StartGroupType)
			b = protowire.AppendFixed32(protowire.AppendTag(b, 3, protowire.Fixed32Type), 7)
			b = protowire.AppendTag(b, 2, protowire.EndGroupType)
			b = protowire.AppendTag(b, num, protowire.EndGroupType)
		}
	}
	return b
}

func rKV(r *rand.Rand) *mvccpb.KeyValue {
	if r.IntN(4) == 0 {
		return nil
	}
	kv := &mvccpb.KeyValue{Key: rBytes(r), Value: rBytes(r), CreateRevision: rInt64(r), ModRevision: rInt64(r), Version: rInt64(r), Lease: rInt64(r)}
	kv.ProtoReflect().SetUnknown(rUnknown(r))
	return kv
}

func rResponse(r *rand.Rand) *pb.WatchResponse {
	m := &pb.WatchResponse{WatchId: rInt64(r), Created: r.IntN(2) == 0, Canceled: r.IntN(2) == 0,
		CompactRevision: rInt64(r), Fragment: r.IntN(2) == 0}
	if r.IntN(3) == 0 {
		m.CancelReason = "etcdserver: 日本 reason"
	}
	if r.IntN(4) != 0 {
		m.Header = &pb.ResponseHeader{ClusterId: r.Uint64(), MemberId: r.Uint64(), Revision: rInt64(r), RaftTerm: r.Uint64()}
		m.Header.ProtoReflect().SetUnknown(rUnknown(r))
	}
	for range r.IntN(5) {
		e := &mvccpb.Event{Type: mvccpb.Event_EventType(r.IntN(4) - 1), Kv: rKV(r), PrevKv: rKV(r)}
		if r.IntN(8) == 0 {
			e.Type = mvccpb.Event_EventType(math.MinInt32)
		}
		e.ProtoReflect().SetUnknown(rUnknown(r))
		m.Events = append(m.Events, e)
	}
	m.ProtoReflect().SetUnknown(rUnknown(r))
	return m
}

// FuzzDecodeAgreesWithProtobuf: random WatchResponses (extreme values,
// unknown fields of every wire type in every message) marshaled by the
// generated code, sometimes two concatenated (merge / last-one-wins), decoded
// by both; must be equal field by field.
func FuzzDecodeAgreesWithProtobuf(f *testing.F) {
	for i := range 8 {
		f.Add(uint64(i), uint64(i*31+7))
	}
	f.Fuzz(func(t *testing.T, s1, s2 uint64) { agreesWithProtobuf(t, s1, s2) })
}

// agreesWithProtobuf checks the response the seeds make (see
// FuzzDecodeAgreesWithProtobuf): decoded alike by both, and sharing
// nothing with its input.
func agreesWithProtobuf(t *testing.T, s1, s2 uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(s1, s2))
	b, err := proto.Marshal(rResponse(r))
	if err != nil {
		t.Fatal(err)
	}
	if r.IntN(2) == 0 { // a second message appended: proto merges
		b2, err := proto.Marshal(rResponse(r))
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, b2...)
	}
	var want pb.WatchResponse
	if err := proto.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	var got wireResponse
	if err := got.decode(b); err != nil {
		t.Fatalf("seeds %d, %d: decode refused what protobuf accepts: %v\n%x", s1, s2, err, b)
	}
	if !equalResponses(got, fromPB(&want)) {
		t.Fatalf("seeds %d, %d: decode differs\n got %+v\nwant %v\n%x", s1, s2, got, &want, b)
	}
	clear(b) // the decoded bytes share nothing with the input
	if !equalResponses(got, fromPB(&want)) {
		t.Fatalf("seeds %d, %d: decoded response changed with the input buffer", s1, s2)
	}
}

// TestDecodeAgreesWithProtobuf runs the differential check on many seeds
// without the fuzzing engine.
func TestDecodeAgreesWithProtobuf(t *testing.T) {
	for s := range uint64(20000) {
		agreesWithProtobuf(t, s, s^0x9e3779b97f4a7c15)
	}
}

// TestDecodeWireEdgeCases: hand-built wire cases protobuf's encoder never
// emits but a decoder must handle as protobuf does.
func TestDecodeWireEdgeCases(t *testing.T) {
	tag := protowire.AppendTag
	v := func(b []byte, n protowire.Number, x uint64) []byte {
		return protowire.AppendVarint(tag(b, n, protowire.VarintType), x)
	}
	by := func(b []byte, n protowire.Number, x []byte) []byte {
		return protowire.AppendBytes(tag(b, n, protowire.BytesType), x)
	}
	kvA := by(v(nil, fieldKVModRevision, 5), fieldKVKey, []byte("a"))
	kvB := by(nil, fieldKVValue, []byte("vv"))
	cases := map[string][]byte{
		"scalar twice, last wins":               v(v(nil, fieldRespWatchID, 1), fieldRespWatchID, 2),
		"header twice merges":                   by(by(nil, fieldRespHeader, v(nil, fieldHeaderRevision, 9)), fieldRespHeader, v(nil, fieldHeaderClusterID, 3)),
		"event kv twice merges":                 by(nil, fieldRespEvents, by(by(nil, fieldEventKV, kvA), fieldEventKV, kvB)),
		"prev_kv twice merges":                  by(nil, fieldRespEvents, by(by(nil, fieldEventPrevKV, kvA), fieldEventPrevKV, kvB)),
		"empty prev_kv present":                 by(nil, fieldRespEvents, by(nil, fieldEventPrevKV, nil)),
		"empty event":                           by(nil, fieldRespEvents, nil),
		"empty header":                          by(nil, fieldRespHeader, nil),
		"explicit empty key after key":          by(nil, fieldRespEvents, by(nil, fieldEventKV, by(kvA, fieldKVKey, nil))),
		"watch_id as fixed64 (wrong wire type)": protowire.AppendFixed64(tag(nil, fieldRespWatchID, protowire.Fixed64Type), 5),
		"events as varint (wrong wire type)":    v(nil, fieldRespEvents, 1),
		"header as varint":                      v(nil, fieldRespHeader, 1),
		"key as varint":                         by(nil, fieldRespEvents, by(nil, fieldEventKV, v(nil, fieldKVKey, 1))),
		"type as bytes":                         by(nil, fieldRespEvents, by(nil, fieldEventType, []byte("x"))),
		"negative watch id 10-byte varint":      v(nil, fieldRespWatchID, uint64(1<<64-1)),
		"min int64 revision":                    by(nil, fieldRespHeader, v(nil, fieldHeaderRevision, 1<<63)),
		"non-minimal varint":                    append(tag(nil, fieldRespWatchID, protowire.VarintType), 0x81, 0x80, 0x80, 0x00),
		"10-byte varint, last byte 1":           append(tag(nil, fieldRespWatchID, protowire.VarintType), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		"packed-looking type field":             by(nil, fieldRespEvents, by(nil, fieldEventType, []byte{1, 1})),
		"field number max":                      v(nil, protowire.MaxValidNumber, 1),
		"reserved 19000":                        v(nil, 19000, 1),
	}
	bad := map[string][]byte{
		"varint overflow 11 bytes":     append(tag(nil, fieldRespWatchID, protowire.VarintType), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		"varint overflow 10th byte 2":  append(tag(nil, fieldRespWatchID, protowire.VarintType), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02),
		"field number max+1":           v(nil, protowire.MaxValidNumber+1, 1),
		"stray end group":              tag(nil, 30, protowire.EndGroupType),
		"unterminated group":           tag(nil, 30, protowire.StartGroupType),
		"mismatched end group":         tag(tag(nil, 30, protowire.StartGroupType), 31, protowire.EndGroupType),
		"wire type 6":                  tag(nil, 30, 6),
		"wire type 7":                  tag(nil, 30, 7),
		"fixed32 truncated":            append(tag(nil, 30, protowire.Fixed32Type), 1, 2),
		"fixed64 truncated":            append(tag(nil, 30, protowire.Fixed64Type), 1, 2, 3, 4, 5, 6, 7),
		"huge length":                  append(tag(nil, fieldRespEvents, protowire.BytesType), 0xff, 0xff, 0xff, 0xff, 0x0f),
		"length 2^63":                  protowire.AppendVarint(tag(nil, fieldRespEvents, protowire.BytesType), 1<<63),
		"bad nested kv":                by(nil, fieldRespEvents, by(nil, fieldEventKV, []byte{0x0a, 0x05})),
		"bad nested header":            by(nil, fieldRespHeader, []byte{0x08}),
		"bad unknown bytes in event":   by(nil, fieldRespEvents, []byte{0xa2, 0x06, 0x10}),
		"cancel reason invalid utf8 2": by(nil, fieldRespCancelReason, []byte{0xed, 0xa0, 0x80}),
		"deep group nesting (>10000)":  deepGroups(10002),
	}
	for name, b := range cases {
		var want pb.WatchResponse
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Errorf("%s: protobuf refuses: %v", name, err)
			continue
		}
		var got wireResponse
		if err := got.decode(b); err != nil {
			t.Errorf("%s: decode refuses: %v", name, err)
			continue
		}
		if !equalResponses(got, fromPB(&want)) {
			t.Errorf("%s: differs\n got %+v\nwant %v", name, got, &want)
		}
	}
	for name, b := range bad {
		var want pb.WatchResponse
		wantErr := proto.Unmarshal(b, &want)
		var got wireResponse
		err := got.decode(b)
		if (err == nil) != (wantErr == nil) {
			t.Errorf("%s: decode err %v, protobuf err %v", name, err, wantErr)
		}
	}
}

func deepGroups(n int) []byte {
	var b []byte
	for range n {
		b = protowire.AppendTag(b, 30, protowire.StartGroupType)
	}
	for range n {
		b = protowire.AppendTag(b, 30, protowire.EndGroupType)
	}
	return b
}

// TestUnmarshalKeepsNoPooledBuffer: through the gRPC codec, with the message in
// several pooled buffers (small and > pooledMax), the decoded keys and values
// survive the buffers being overwritten and freed.
func TestUnmarshalKeepsNoPooledBuffer(t *testing.T) {
	for _, big := range []bool{false, true} {
		m := &pb.WatchResponse{WatchId: 3, CancelReason: "r", Events: []*mvccpb.Event{
			{Kv: kv("key-a", "value-a", 9), PrevKv: kv("key-a", "old", 8)}, {Kv: kv("key-b", "value-b", 9)}}}
		if big {
			m.Events = append(m.Events, &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: []byte("big"), Value: bytes.Repeat([]byte("x"), pooledMax+10), ModRevision: 9}})
		}
		b, _ := proto.Marshal(m)
		pool := mem.DefaultBufferPool()
		var data mem.BufferSlice
		for rest := b; len(rest) > 0; {
			n := min(len(rest), 7+len(rest)/3)
			data = append(data, mem.Copy(rest[:n], pool))
			rest = rest[n:]
		}
		var r wireResponse
		if err := (codec{}).Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		for _, buf := range data {
			clear(buf.ReadOnlyData()) // gRPC reuses them
		}
		data.Free()
		if !equalResponses(r, fromPB(m)) {
			t.Fatalf("big=%v: decoded response changed with gRPC's buffers", big)
		}
	}
}

// TestEncodeEveryRequestShape: every create shape the library can send (all
// builders x all option combinations x ids/revisions at the limits), plus
// cancel and progress, is byte-for-byte protobuf's and round-trips through
// the generated decoder.
func TestEncodeEveryRequestShape(t *testing.T) {
	bases := []Request{Key("k"), Key(""), Prefix("p/"), Prefix(""), Prefix("\xff\xff"), Prefix("a\xff"), FromKey(""), FromKey("x"),
		Range("a", "b"), Range("", "b"), {Key: []byte{}, End: []byte{}}, {Key: bytes.Repeat([]byte("k"), 300), End: bytes.Repeat([]byte("z"), 200)}}
	for _, base := range bases {
		for flags := range 64 {
			r := base
			r.PrevKV, r.NoPut, r.NoDelete = flags&1 != 0, flags&2 != 0, flags&4 != 0
			r.ProgressNotify, r.Fragment, r.Isolated = flags&8 != 0, flags&16 != 0, flags&32 != 0
			for _, id := range extremes {
				for _, start := range extremes {
					r.Revision = start
					wr := wireRequest{kind: requestCreate, id: id, start: start, watch: packedOf(r)}
					want := createPB(r, id, start)
					wantB, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
					if err != nil {
						t.Fatal(err)
					}
					got := wr.encode()
					if !bytes.Equal(got, wantB) {
						t.Fatalf("%v flags %b id %d start %d:\n got %x\nwant %x", r, flags, id, start, got, wantB)
					}
					if m := encoded(t, &wr); !proto.Equal(m, want) {
						t.Fatalf("round trip differs: %v vs %v", m, want)
					}
				}
			}
		}
	}
	for _, id := range extremes {
		wr := wireRequest{kind: requestCancel, id: id}
		want, _ := proto.Marshal(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}})
		if got := wr.encode(); !bytes.Equal(got, want) {
			t.Fatalf("cancel %d: got %x want %x", id, got, want)
		}
	}
	want, _ := proto.Marshal(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
	if got := (&wireRequest{kind: requestProgress}).encode(); !bytes.Equal(got, want) {
		t.Fatalf("progress: got %x want %x", got, want)
	}
	// the codec's Marshal hands gRPC the same bytes
	wr := wireRequest{kind: requestCreate, id: 5, watch: packedOf(Prefix("p").WithPrevKV())}
	bs, err := (codec{}).Marshal(&wr)
	if err != nil || !bytes.Equal(bs.Materialize(), wr.encode()) {
		t.Fatalf("codec Marshal: %v", err)
	}
}
