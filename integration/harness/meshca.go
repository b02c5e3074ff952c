package harness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/addrfile"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
)

// BuildMeshca builds the meshca binary into dir and returns its path.
func BuildMeshca(dir string) (string, error) {
	bin := filepath.Join(dir, "meshca")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/meshca")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: build meshca: %v\n%s", err, out)
	}
	return bin, nil
}

// BuildMeshcaHSM builds the HSM variant of meshca, with the pkcs11
// upstream, as make build-hsm does (cgo, the Makefile's HSM_TAGS), into
// dir and returns its path.
func BuildMeshcaHSM(dir string) (string, error) {
	bin := filepath.Join(dir, "meshca-hsm")
	cmd := exec.Command("go", "build", "-tags", "pkcs11,netgo,osusergo", "-o", bin, "./cmd/meshca")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: build meshca-hsm: %v\n%s", err, out)
	}
	return bin, nil
}

// Meshca is a running `meshca serve` process.
type Meshca struct {
	Addr      string // gRPC host:port
	AdminAddr string // HTTP host:port
	// BundleAddr is the SPIFFE bundle endpoint's host:port, when meshca
	// serves one (--bundle-endpoint-listen).
	BundleAddr string
	// Started is how long the process took from exec to ready.
	Started time.Duration
	cmd     *exec.Cmd
	logs    *lockedBuffer
	done    chan struct{}
}

// StartMeshca runs `bin serve` with args plus loopback listeners and JSON
// logs, waits until it serves, and stops it at cleanup.
func StartMeshca(tb testing.TB, bin string, args ...string) *Meshca {
	tb.Helper()
	m, err := StartMeshcaProcess(bin, args...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		m.Stop()
		if tb.Failed() {
			tb.Logf("meshca log:\n%s", m.Logs())
		}
	})
	m.checkServing(tb)
	return m
}

// checkServing lints the chains meshca serves with: gRPC, and the SPIFFE
// bundle endpoint when it runs one.
func (m *Meshca) checkServing(tb testing.TB) {
	tb.Helper()
	for _, addr := range []string{m.Addr, m.BundleAddr} {
		if addr == "" {
			continue
		}
		chain, err := ServingChain(addr, "", nil)
		if err != nil {
			tb.Errorf("harness: serving certificate of meshca at %s: %v", addr, err)
			continue
		}
		CheckCertificates(tb, chain...)
	}
}

// StartMeshcaProcess is StartMeshca for callers without a testing.TB; the
// caller stops the process. The kernel picks the ports: meshca reports
// them in its --address-file, and it is ready when its /readyz says so.
func StartMeshcaProcess(bin string, args ...string) (*Meshca, error) {
	dir, err := os.MkdirTemp("", "meshca-addr-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	addrFile := filepath.Join(dir, "addresses.json")
	full := append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json",
		"--address-file", addrFile}, args...)
	m := &Meshca{cmd: exec.Command(bin, full...), logs: &lockedBuffer{}, done: make(chan struct{})}
	stderr, err := m.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	// Audit events go to standard output: Logs holds both streams.
	stdout, err := m.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("harness: start meshca: %w", err)
	}
	go m.readLogs(stderr, stdout)
	if err := m.waitReady(addrFile, 30*time.Second); err != nil {
		m.Stop()
		return nil, fmt.Errorf("harness: %w\n%s", err, m.Logs())
	}
	m.Started = time.Since(start)
	return m, nil
}

// waitReady waits for the addresses meshca reports, then for its /readyz.
func (m *Meshca) waitReady(addrFile string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	for ; time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st := m.Exited(); st != nil {
			return fmt.Errorf("meshca exited before it was ready: %v", st)
		}
		if m.Addr == "" {
			a, err := addrfile.Read(addrFile)
			if err != nil {
				continue
			}
			m.Addr, m.AdminAddr, m.BundleAddr = a.GRPC, a.Admin, a.BundleEndpoint
		}
		r, err := client.Get("http://" + m.AdminAddr + "/readyz")
		if err != nil {
			continue
		}
		r.Body.Close()
		if r.StatusCode == http.StatusOK {
			return nil
		}
	}
	return fmt.Errorf("meshca was not ready within %v", timeout)
}

// readLogs copies the lines of every stream into the logs, then waits
// for the process (which must follow every read).
func (m *Meshca) readLogs(streams ...io.Reader) {
	var wg sync.WaitGroup
	for _, r := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				m.logs.WriteString(sc.Text() + "\n")
			}
		}()
	}
	wg.Wait()
	_ = m.cmd.Wait()
	close(m.done)
}

// Logs returns everything meshca logged so far: its operational log
// (standard error) and its audit events (standard output), line by line.
func (m *Meshca) Logs() string { return m.logs.String() }

// Stop sends SIGTERM and waits for the process to exit.
func (m *Meshca) Stop() {
	if m.cmd.Process == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(15 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done
	}
}

// Kill sends SIGKILL, as a crash would, and waits for the process to
// exit.
func (m *Meshca) Kill() {
	if m.cmd.Process == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	<-m.done
}

// Signal sends sig to the process (an error once it has exited), and
// Pid is its id, for reading /proc; tests that freeze it (SIGSTOP) to look
// at it before a Kill use both.
func (m *Meshca) Signal(sig os.Signal) error { return m.cmd.Process.Signal(sig) }

// Pid is the process id.
func (m *Meshca) Pid() int { return m.cmd.Process.Pid }

// Exited reports the exit state once the process has stopped.
func (m *Meshca) Exited() *os.ProcessState {
	select {
	case <-m.done:
		return m.cmd.ProcessState
	default:
		return nil
	}
}

// SelfSigned is a meshca serving a self-signed root from a fresh state
// directory, with that root at hand for clients.
type SelfSigned struct {
	*Meshca
	StateDir string
	Roots    *x509.CertPool
	RootsPEM []byte
}

// StartSelfSigned runs meshca with a new state directory against the
// cluster of kubeconfig, with extra flags, and reads its root bundle.
func StartSelfSigned(tb testing.TB, bin, kubeconfig string, extra ...string) *SelfSigned {
	tb.Helper()
	state := filepath.Join(tb.TempDir(), "state")
	m := StartMeshca(tb, bin, append([]string{"--state-dir", state, "--kubeconfig", kubeconfig}, extra...)...)
	tb.Logf("meshca ready after %v", m.Started)
	parsed, raw, err := RootBundle(context.Background(), bin, "--state-dir", state)
	if err != nil {
		tb.Fatal(err)
	}
	return &SelfSigned{Meshca: m, StateDir: state, Roots: certs.Pool(parsed...), RootsPEM: raw}
}

// RootBundle runs `meshca root bundle` for a state or CA directory; a
// root with a zlint finding is an error.
func RootBundle(ctx context.Context, bin, flag, dir string) ([]*x509.Certificate, []byte, error) {
	out, err := exec.CommandContext(ctx, bin, "root", "bundle", flag, dir).Output()
	if err != nil {
		return nil, nil, fmt.Errorf("meshca root bundle: %w", err)
	}
	parsed, err := pemutil.ParseCertificates(out)
	if err != nil {
		return nil, nil, err
	}
	var findings []string
	for _, c := range parsed {
		for _, f := range Lint(c) {
			findings = append(findings, f.String())
		}
	}
	if len(findings) > 0 {
		return nil, nil, fmt.Errorf("meshca root bundle:\n%s", strings.Join(findings, "\n"))
	}
	return parsed, out, nil
}

// WaitForLog waits until meshca logged a line containing every fragment.
func (m *Meshca) WaitForLog(timeout time.Duration, fragments ...string) bool {
	return m.WaitForLogAfter(0, timeout, fragments...)
}

// LogMark is where the log ends now: WaitForLogAfter(mark, ...) looks
// only at what meshca logs from here on.
func (m *Meshca) LogMark() int { return len(m.Logs()) }

// WaitForLogAfter waits until meshca logged, after mark, a line
// containing every fragment.
func (m *Meshca) WaitForLogAfter(mark int, timeout time.Duration, fragments ...string) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(m.Logs()[mark:], "\n") {
			all := true
			for _, f := range fragments {
				all = all && strings.Contains(line, f)
			}
			if all {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) WriteString(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
