package cow

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// FuzzMap decodes ops from the input, three bytes each: an op byte and a
// 16-bit argument. It checks the tree invariants after each op and, at the
// end, the editor and every snapshot taken on the way against the oracle.
func FuzzMap(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 0, 2, 2, 0, 1, 5, 0, 0, 2, 0, 2})
	f.Add([]byte{0xfe, 0, 0, 5, 0, 0, 0xff, 0, 0, 5, 0, 0, 0xfe, 0, 10})
	f.Add([]byte{4, 0xff, 0xff, 4, 0xff, 0xff, 5, 0, 0, 3, 0, 7, 0xff, 0x01, 0, 7, 0, 0})
	rng := rand.New(rand.NewPCG(5, 5))
	for range 4 {
		seed := make([]byte, 96)
		for i := range seed {
			seed[i] = byte(rng.Uint32())
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newHarness(t)
		for ops := 0; len(data) >= 3 && ops < maxFuzzOps; ops++ {
			fuzzOp(h, data[0], int(binary.BigEndian.Uint16(data[1:3])))
			data = data[3:]
			h.checkOp()
		}
		h.checkAll()
	})
}

// Bounds on the work of one input, so that the fuzzer keeps its pace: up
// to 6k keys, enough for three levels, and eight snapshots.
const (
	maxFuzzOps   = 96
	maxFuzzSnaps = 8
)

// fuzzOp applies one op; the high five bits of op size the bulk ones.
func fuzzOp(h *harness, op byte, arg int) {
	bulk := 2 * (int(op>>3) + 1) // 2..64 keys
	switch op & 7 {
	case 0, 1:
		h.set(key(arg))
	case 2:
		h.del(key(arg))
	case 3:
		if len(h.o.keys) > 0 {
			h.del(h.o.keys[arg%len(h.o.keys)])
		}
	case 4:
		h.appendRun(1+arg%bulk, arg>>14, false)
	case 5:
		if len(h.snaps) < maxFuzzSnaps {
			h.snapshot()
		}
	case 6:
		for i := range bulk {
			h.set(key(arg + i))
		}
	case 7:
		if op>>3 == 0 && len(h.snaps) > 0 {
			h.branch(arg)
			return
		}
		for i := range bulk {
			h.del(key(arg + i))
		}
	}
}
