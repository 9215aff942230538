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

// binary returns the etcd on PATH, else Debian's, or "" if neither exists.
func binary() string {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd"
	}
	return ""
}

func TestEtcd34(t *testing.T) {
	bin := binary()
	if bin == "" {
		t.Skip("no etcd binary on PATH or at /usr/bin/etcd: apt-get install -y etcd-server (.ci/run does)")
	}
	p := scenarios.StartProcess(t, bin)
	e := scenarios.Connect(t, p.Endpoint)
	if e.Version.Major != 3 || e.Version.Minor != 4 {
		t.Skipf("%s is etcd %s, not 3.4; the 3.5+ lines have modules of their own", bin, e.Version)
	}
	scenarios.Run(t, p.Endpoint)
}
