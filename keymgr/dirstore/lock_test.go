package dirstore_test

import (
	"bufio"
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// The environment that turns this test binary into a helper process for
// the cross-process tests: the mode and the state directory.
const (
	helperModeEnv = "MESHCA_KEYMGR_HELPER_MODE"
	helperDirEnv  = "MESHCA_KEYMGR_HELPER_DIR"
)

// Helper modes.
const (
	modeLoad = "load" // LoadOrCreate, print the root's fingerprint
	modeHold = "hold" // LockDir, print "locked", hold until stdin closes
)

// TestHelperProcess is not a test. Started by startHelper, it prints
// "ready", waits for a line on stdin, then does what its mode says.
func TestHelperProcess(t *testing.T) {
	mode, dir := os.Getenv(helperModeEnv), os.Getenv(helperDirEnv)
	if mode == "" {
		return
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("ready")
	if _, err := in.ReadString('\n'); err != nil {
		helperExit(err)
	}
	switch mode {
	case modeLoad:
		a, _, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{})
		if err != nil {
			helperExit(err)
		}
		fmt.Println(fingerprint(a.Cert.Raw))
	case modeHold:
		unlock, err := dirstore.LockDir(context.Background(), dir)
		if err != nil {
			helperExit(err)
		}
		fmt.Println("locked")
		_, _ = io.Copy(io.Discard, in)
		if err := unlock(); err != nil {
			helperExit(err)
		}
	default:
		helperExit(fmt.Errorf("unknown mode %q", mode))
	}
	os.Exit(0)
}

func helperExit(err error) {
	fmt.Println("error:", err)
	os.Exit(1)
}

// helper is a child process running TestHelperProcess.
type helper struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// startHelper starts a helper and waits until it is ready; go releases it.
func startHelper(t *testing.T, mode, dir string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperModeEnv+"="+mode, helperDirEnv+"="+dir)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		_ = h.in.Close()
		_ = h.cmd.Wait()
	})
	if got := h.line(t); got != "ready" {
		t.Fatalf("helper: %q, want ready", got)
	}
	return h
}

func (h *helper) start(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(h.in, "go\n"); err != nil {
		t.Fatal(err)
	}
}

func (h *helper) line(t *testing.T) string {
	t.Helper()
	s, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatalf("helper output: %q: %v", s, err)
	}
	return strings.TrimSpace(s)
}

// stop closes the helper's stdin, which ends a hold, and waits for it.
func (h *helper) stop(t *testing.T) {
	t.Helper()
	_ = h.in.Close()
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
}

func fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// TestLoadOrCreateConcurrent starts callers at once on one empty state
// directory: every caller must end with the same root, and the files on
// disk must be that root and its key.
func TestLoadOrCreateConcurrent(t *testing.T) {
	tests := []struct {
		name                  string
		goroutines, processes int
	}{
		{name: "goroutines", goroutines: 16},
		{name: "processes", processes: 4},
		{name: "goroutines and processes", goroutines: 8, processes: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			helpers := make([]*helper, tt.processes)
			for i := range helpers {
				helpers[i] = startHelper(t, modeLoad, dir)
			}
			begin := make(chan struct{})
			got := make([]string, tt.goroutines)
			errs := make([]error, tt.goroutines)
			var wg sync.WaitGroup
			for i := range tt.goroutines {
				wg.Go(func() {
					<-begin
					a, _, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{})
					if err != nil {
						errs[i] = err
						return
					}
					got[i] = fingerprint(a.Cert.Raw)
				})
			}
			for _, h := range helpers {
				h.start(t)
			}
			close(begin)
			var fromChildren []string
			for _, h := range helpers {
				fromChildren = append(fromChildren, h.line(t))
			}
			wg.Wait()
			got = append(got, fromChildren...)
			for i, err := range errs {
				if err != nil {
					t.Fatalf("caller %d: %v", i, err)
				}
			}
			onDisk := loadState(t, dir)
			want := fingerprint(onDisk.Cert.Raw)
			for i, fp := range got {
				if fp != want {
					t.Errorf("caller %d got %q, the state directory holds root %s", i, fp, want)
				}
			}
		})
	}
}

// loadState loads dir and checks that its key is its root's.
func loadState(t *testing.T, dir string) *keymgr.Authority {
	t.Helper()
	a, err := keymgr.LoadCACerts(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, keymgr.FileCAKey))
	if err != nil {
		t.Fatal(err)
	}
	key, err := pemutil.ParsePrivateKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if !key.Public().(equaler).Equal(a.Cert.PublicKey) {
		t.Fatal("the key on disk does not match the root on disk")
	}
	return a
}

// holder keeps a state directory locked, in this process or another.
type holder func(t *testing.T, dir string) (release func())

func holdInProcess(t *testing.T, dir string) func() {
	unlock, err := dirstore.LockDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := unlock(); err != nil {
			t.Fatal(err)
		}
	}
}

func holdInChild(t *testing.T, dir string) func() {
	h := startHelper(t, modeHold, dir)
	h.start(t)
	if got := h.line(t); got != "locked" {
		t.Fatalf("helper: %q, want locked", got)
	}
	return func() { h.stop(t) }
}

func TestLockDirContextEnds(t *testing.T) {
	const wait = 100 * time.Millisecond
	tests := []struct {
		name     string
		hold     holder
		canceled bool
		wantErr  error
	}{
		{name: "held in this process", hold: holdInProcess, wantErr: context.DeadlineExceeded},
		{name: "held by another process", hold: holdInChild, wantErr: context.DeadlineExceeded},
		{name: "context already canceled", canceled: true, wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			release := func() {}
			if tt.hold != nil {
				release = tt.hold(t, dir)
			}
			// start before the context's clock, so that the wait
			// measured is never shorter than the context's.
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if tt.canceled {
				cancel()
			}
			unlock, err := dirstore.LockDir(ctx, dir)
			var le *dirstore.LockedError
			switch {
			case err == nil:
				_ = unlock()
				t.Fatal("LockDir took a lock another holder keeps")
			case !errors.As(err, &le) || le.Dir != dir || !errors.Is(err, tt.wantErr):
				t.Fatalf("err = %#v, want a LockedError for %s wrapping %v", err, dir, tt.wantErr)
			case !strings.Contains(err.Error(), "state directory "+dir+" is locked by another meshca process"):
				t.Fatalf("err = %q, want it to say the directory is locked", err)
			case tt.hold != nil && time.Since(start) < wait:
				t.Fatalf("gave up after %v, before the context ended", time.Since(start))
			}
			release()
			ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			unlock, err = dirstore.LockDir(ctx, dir)
			if err != nil {
				t.Fatalf("after release: %v", err)
			}
			if err := unlock(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestLockDir(t *testing.T) {
	dir := t.TempDir()
	unlock, err := dirstore.LockDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, dirstore.FileLock))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("lock file mode %v, want 0600", fi.Mode().Perm())
	}
	for range 2 {
		if err := unlock(); err != nil {
			t.Fatalf("unlock: %v", err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, dirstore.FileLock)); err != nil {
		t.Errorf("the lock file must stay after unlock: %v", err)
	}
	if _, err := dirstore.LockDir(context.Background(), filepath.Join(dir, "missing")); err == nil {
		t.Error("LockDir must not create a missing directory")
	}
}

// TestLoadOrCreateWaitsForLock: LoadOrCreate must neither read nor write
// the state directory while another holder has it locked.
func TestLoadOrCreateWaitsForLock(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration
		release time.Duration // when the holder lets go; 0: after LoadOrCreate returns
		wantErr bool
	}{
		{name: "released in time", timeout: 10 * time.Second, release: 200 * time.Millisecond},
		{name: "held past the timeout", timeout: 100 * time.Millisecond, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			release := holdInProcess(t, dir)
			if tt.release > 0 {
				timer := time.AfterFunc(tt.release, func() {
					if _, err := os.Stat(filepath.Join(dir, keymgr.FileCAKey)); err == nil {
						t.Error("LoadOrCreate wrote the state directory while it was locked")
					}
					release()
				})
				defer timer.Stop()
			}
			start := time.Now()
			_, created, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{LockTimeout: tt.timeout})
			if tt.release == 0 {
				release()
			}
			var le *dirstore.LockedError
			switch {
			case tt.wantErr && !errors.As(err, &le):
				t.Fatalf("err = %v, want a LockedError", err)
			case tt.wantErr:
				if _, err := os.Stat(filepath.Join(dir, keymgr.FileCAKey)); err == nil {
					t.Fatal("LoadOrCreate wrote a key without the lock")
				}
			case err != nil || !created:
				t.Fatalf("created=%v err=%v", created, err)
			case time.Since(start) < tt.release:
				t.Fatalf("returned after %v, before the holder let go", time.Since(start))
			}
		})
	}
}

func TestLoadOrCreateModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if _, _, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		want os.FileMode
	}{
		{".", 0o700},
		{dirstore.FileLock, 0o600},
		{keymgr.FileCAKey, 0o600},
		{keymgr.FileCACert, 0o644},
		{keymgr.FileRootCert, 0o644},
		{keymgr.FileCertChain, 0o644},
	}
	for _, tt := range tests {
		fi, err := os.Stat(filepath.Join(dir, tt.name))
		if err != nil {
			t.Error(err)
			continue
		}
		if fi.Mode().Perm() != tt.want {
			t.Errorf("%s: mode %v, want %v", tt.name, fi.Mode().Perm(), tt.want)
		}
	}
}
