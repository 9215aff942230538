package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/etcdwatch/etcdwatch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemo runs the example as `make run` does and checks that every demo
// write is shown, in order.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, "", etcdwatch.Prefix("demo/"), true); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"PUT demo/config/color rev=2", "value: blue",
		"PUT demo/config/size rev=3", "value: large",
		"PUT demo/config/color rev=4", "value: green", "previous: blue",
		"DELETE demo/config/size rev=5", "previous: large",
		"demo done: every write arrived",
	}
	got := out.String()
	for _, line := range want {
		i := strings.Index(got, line)
		if i < 0 {
			t.Fatalf("output lacks %q in order:\n%s", line, out.String())
		}
		got = got[i+len(line):]
	}
}
