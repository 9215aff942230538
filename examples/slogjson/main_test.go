package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// TestMain checks that nothing outlives the tests but the idle peer HTTP
// connections of stopped etcd members, which close on their own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdwatchtest.LeakOptions()...)
}

// TestLines runs the demo and reads its JSON lines back: the server-ended
// watch exactly, the reconnection by its fields (gRPC's error text and how
// long the watches were down vary from run to run).
func TestLines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	noTime := func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	require.NoError(t, run(ctx, newLogger(&out, noTime)))

	var endedLine string
	var lines []map[string]any
	byMsg := make(map[string]map[string]any)
	for sc := bufio.NewScanner(&out); sc.Scan(); {
		var line map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), "not JSON: %s", sc.Text())
		require.NotContains(t, line, "time")
		require.Equal(t, "demo", line["stream"], "every line carries the logger's attributes")
		require.NotEqual(t, "ERROR", line["level"], "%s", sc.Text())
		msg, _ := line["msg"].(string)
		if _, seen := byMsg[msg]; !seen {
			byMsg[msg] = line
			lines = append(lines, line)
		}
		if msg == "etcdwatch: server ended the watch" {
			endedLine = sc.Text()
		}
	}
	require.Equal(t, `{"level":"INFO","msg":"etcdwatch: server ended the watch","stream":"demo",`+
		`"watch":"keys [\"demo/\", \"demo0\")","id":4294967296,"err":"etcdwatch: watch needs revision 2; history starts at 4"}`, endedLine)

	ended := byMsg["etcdwatch: watch stream ended; reconnecting"]
	require.NotNil(t, ended, "no line for the cut stream in %v", lines)
	require.Equal(t, "INFO", ended["level"])
	require.NotEmpty(t, ended["err"])
	require.Equal(t, "0s", ended["after"], "a stream that worked is replaced at once")
	require.Equal(t, 1.0, ended["watches"])

	back := byMsg["etcdwatch: watch stream back"]
	require.NotNil(t, back, "no line for the new stream in %v", lines)
	require.Equal(t, "INFO", back["level"])
	down, err := time.ParseDuration(back["down"].(string))
	require.NoError(t, err)
	require.Positive(t, down)
	require.Equal(t, 1.0, back["watches"])
}
