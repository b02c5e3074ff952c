package harness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
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

// Meshca is a running `meshca serve` process.
type Meshca struct {
	Addr      string // gRPC host:port
	AdminAddr string // HTTP host:port
	// Started is how long the process took from exec to serving.
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
	return m
}

// StartMeshcaProcess is StartMeshca for callers without a testing.TB; the
// caller stops the process.
func StartMeshcaProcess(bin string, args ...string) (*Meshca, error) {
	full := append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"}, args...)
	m := &Meshca{cmd: exec.Command(bin, full...), logs: &lockedBuffer{}, done: make(chan struct{})}
	stderr, err := m.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("harness: start meshca: %w", err)
	}
	ready := make(chan struct{})
	go m.readLogs(stderr, ready)
	select {
	case <-ready:
		m.Started = time.Since(start)
		return m, nil
	case <-m.done:
		return nil, fmt.Errorf("harness: meshca exited before serving: %v\n%s", m.cmd.ProcessState, m.Logs())
	case <-time.After(30 * time.Second):
		m.Stop()
		return nil, fmt.Errorf("harness: meshca did not serve within 30s\n%s", m.Logs())
	}
}

func (m *Meshca) readLogs(r io.Reader, ready chan struct{}) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	signalled := false
	for sc.Scan() {
		line := sc.Text()
		m.logs.WriteString(line + "\n")
		if signalled {
			continue
		}
		var ev struct {
			Msg   string `json:"msg"`
			GRPC  string `json:"grpc"`
			Admin string `json:"admin"`
		}
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Msg == "serving" {
			m.Addr, m.AdminAddr = ev.GRPC, ev.Admin
			signalled = true
			close(ready)
		}
	}
	_ = m.cmd.Wait()
	close(m.done)
}

// Logs returns everything meshca logged so far.
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

// Exited reports the exit state once the process has stopped.
func (m *Meshca) Exited() *os.ProcessState {
	select {
	case <-m.done:
		return m.cmd.ProcessState
	default:
		return nil
	}
}

// RootBundle runs `meshca root bundle` for a state or CA directory.
func RootBundle(ctx context.Context, bin, flag, dir string) ([]*x509.Certificate, []byte, error) {
	out, err := exec.CommandContext(ctx, bin, "root", "bundle", flag, dir).Output()
	if err != nil {
		return nil, nil, fmt.Errorf("meshca root bundle: %w", err)
	}
	certs, err := pemutil.ParseCertificates(out)
	return certs, out, err
}

// WaitForLog waits until meshca logged a line containing every fragment.
func (m *Meshca) WaitForLog(timeout time.Duration, fragments ...string) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(m.Logs(), "\n") {
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
