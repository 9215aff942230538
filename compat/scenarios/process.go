package scenarios

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// MaxRequestBytes is the --max-request-bytes every server under test runs
// with: it accepts the 3 MiB transactions of the fragment scenario and
// fragments watch responses above it plus 512 KiB.
const MaxRequestBytes = 7 << 19

// Process is an etcd binary running as a child process: one member on
// loopback ports the kernel handed out, with its data in a test's
// temporary directory.
type Process struct {
	// Endpoint is the host:port of its client listener, on 127.0.0.1.
	Endpoint string

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait has returned
	err    error         // cmd.Wait's, set before exited is closed
	log    string        // path of the member's log
}

// StartProcess starts the etcd binary bin as a single member and waits
// until it serves a linearizable read. It stops the member when the test
// ends. A start that fails (a port taken between the kernel handing it out
// and etcd binding it) is tried again, three times in all.
func StartProcess(t testing.TB, bin string, args ...string) *Process {
	t.Helper()
	var errs []error
	for attempt := range 3 {
		p, err := startProcess(filepath.Join(t.TempDir(), fmt.Sprint("try", attempt)), bin, args)
		if err == nil {
			t.Cleanup(p.Stop)
			return p
		}
		errs = append(errs, err)
	}
	t.Fatal(errors.Join(errs...))
	return nil
}

func startProcess(dir, bin string, extra []string) (*Process, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	client, err := freePort()
	if err != nil {
		return nil, err
	}
	peer, err := freePort()
	if err != nil {
		return nil, err
	}
	cu, pu := "http://"+client, "http://"+peer
	args := append([]string{
		"--name=m0",
		"--data-dir=" + filepath.Join(dir, "data"),
		"--listen-client-urls=" + cu, "--advertise-client-urls=" + cu,
		"--listen-peer-urls=" + pu, "--initial-advertise-peer-urls=" + pu,
		"--initial-cluster=m0=" + pu,
		"--heartbeat-interval=20", "--election-timeout=200",
		fmt.Sprint("--max-request-bytes=", MaxRequestBytes),
		"--logger=zap", "--log-level=warn",
	}, extra...)
	logPath := filepath.Join(dir, "etcd.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Endpoint: client, cmd: cmd, exited: make(chan struct{}), log: logPath}
	go func() { // exits when the child does; Stop waits for it
		p.err = cmd.Wait()
		close(p.exited)
	}()
	if err := p.waitReady(); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// waitReady returns once a linearizable read succeeds (the member has
// elected itself and applies requests), or an error if the child exits or
// a minute passes.
func (p *Process) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() { // exits with waitReady, or when the child exits first
		select {
		case <-p.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := Dial(p.Endpoint)
	if err != nil {
		return err
	}
	defer conn.Close()
	kv := pb.NewKVClient(conn)
	for {
		// WaitForReady waits for the listener; a read before the member has
		// a leader fails at once or times out, and is asked again.
		_, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("ready")}, grpc.WaitForReady(true))
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("scenarios: etcd %s not ready (%w); exited: %v; log:\n%s", p.Endpoint, err, p.exitErr(), p.logTail())
		case <-time.After(20 * time.Millisecond): // a retry's pace, not a synchronisation
		}
	}
}

func (p *Process) exitErr() error {
	select {
	case <-p.exited:
		if p.err == nil {
			return errors.New("exit status 0")
		}
		return p.err
	default:
		return nil
	}
}

// logTail returns the end of the member's log.
func (p *Process) logTail() string {
	b, _ := os.ReadFile(p.log)
	const keep = 4 << 10
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return strings.TrimSpace(string(b))
}

// Stop ends the member (SIGTERM, then SIGKILL after ten seconds) and waits
// until it has exited. Stopping it again does nothing.
func (p *Process) Stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// freePort returns a loopback host:port the kernel just handed out.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Dial returns a plain-text gRPC connection to endpoint that sends and
// receives messages up to 64 MiB, for etcd's generated clients and for
// etcdwatch.Open. The caller closes it.
func Dial(endpoint string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
}

// BuildServer builds the main package in dir (a server module pinned to
// one etcd release) into out and returns the binary's path. The first
// build of a release compiles etcd (about a minute on 2 cores); later ones
// come from the build cache.
func BuildServer(dir, out string) (string, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("scenarios: building the server needs the go command: %w", err)
	}
	bin := filepath.Join(out, "etcd")
	cmd := exec.Command(gobin, "build", "-buildvcs=false", "-o", bin, ".")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("scenarios: go build in %s: %w\n%s", dir, err, b)
	}
	return bin, nil
}

// MainBuilt is the TestMain of a module that runs the scenarios against a
// server it builds from the module in serverDir: it builds the binary into
// a temporary directory, stores its path in bin, runs the tests, and then
// checks that no goroutine outlives them. It returns the exit code.
func MainBuilt(m *testing.M, serverDir string, bin *string) int {
	dir, err := os.MkdirTemp("", "etcdwatch-compat-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if *bin, err = BuildServer(serverDir, dir); err != nil {
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

// RunBuilt runs every scenario against a member of the server binary bin
// and checks that it reports release want.
func RunBuilt(t *testing.T, bin, want string) {
	p := StartProcess(t, bin)
	if v := Run(t, p.Endpoint); v.String() != want {
		t.Errorf("the server reports etcd %s, want %s", v, want)
	}
}
