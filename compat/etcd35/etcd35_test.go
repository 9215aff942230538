// Package etcd35 runs the shared scenarios against etcd 3.5.35, built from
// the module in ./server (pinned to that release) and started as a child
// process: etcd's 3.5 API module cannot be linked beside the one etcdwatch
// needs, so the server cannot run in the test process.
package etcd35

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/etcdwatch/etcdwatch/compat/scenarios"
)

// want is the release ./server/go.mod pins.
const want = "3.5.35"

// bin is the server binary TestMain built.
var bin string

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "etcdwatch-etcd35-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if bin, err = scenarios.BuildServer("server", dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

func TestEtcd35(t *testing.T) {
	p := scenarios.StartProcess(t, bin)
	if v := scenarios.Run(t, p.Endpoint); v.String() != want {
		t.Errorf("the server reports etcd %s, want %s", v, want)
	}
}
