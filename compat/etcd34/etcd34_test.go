// Package etcd34 runs the shared scenarios against Debian's etcd 3.4
// binary (apt-get install etcd-server), started as a child process.
package etcd34

import (
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"

	"github.com/etcdwatch/etcdwatch/compat/scenarios"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// binary returns $ETCD34 when set, else the etcd on PATH, or "" if
// neither exists.
func binary() string {
	if p := os.Getenv("ETCD34"); p != "" {
		return p
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	return ""
}

// unavailable skips the test, or fails it under CI (CI set), where
// .ci/run installs etcd 3.4 and a skip would pass with nothing run.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format+" (CI is set: .ci/run installs etcd-server)", args...)
	}
	t.Skipf(format, args...)
}

func TestEtcd34(t *testing.T) {
	bin := binary()
	if bin == "" {
		unavailable(t, "no etcd binary in $ETCD34 or on PATH: apt-get install -y etcd-server")
	}
	p := scenarios.StartProcess(t, bin)
	e := scenarios.Connect(t, p.Endpoint)
	if e.Version.Major != 3 || e.Version.Minor != 4 {
		unavailable(t, "%s is etcd %s, not 3.4; the 3.5+ lines have modules of their own", bin, e.Version)
	}
	scenarios.Run(t, p.Endpoint)
}
