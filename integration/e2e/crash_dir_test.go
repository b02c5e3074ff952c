package e2e

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// dirLook is what a state directory holds besides its state: what a
// killed writer may leave, and the next save clears.
type dirLook struct {
	temps       []string // temporary files of atomic writes cut short
	unnamedKeys []string // key files of a state that was never committed
	retiredKeys []string // files still holding a retired authority's key
	staleLayout bool     // the cacerts layout is behind the state
}

func (l dirLook) clean() bool {
	return len(l.temps)+len(l.unnamedKeys)+len(l.retiredKeys) == 0 && !l.staleLayout
}

// tallyInto counts the leftovers in c.
func (l dirLook) tallyInto(c tally) {
	for what, left := range map[string]bool{
		"left a temporary file": len(l.temps) > 0, "left a key of a state never committed": len(l.unnamedKeys) > 0,
		"left a retired key until the next save": len(l.retiredKeys) > 0, "left the cacerts layout behind": l.staleLayout,
	} {
		if left {
			c[what]++
		}
	}
}

// lookDir checks the files of the state directory dir, which holds st
// (nil: none): the directory is 0700, state.json 0644, every file that
// holds a private key 0600, every key st names is there; and it reports
// the leftovers.
func lookDir(t *testing.T, dir string, st *keymgr.State) dirLook {
	t.Helper()
	var l dirLook
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) && st == nil {
		return l
	} else if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("state directory mode %v, want 0700", fi.Mode().Perm())
	}
	named, retired := map[string]bool{}, map[string]bool{}
	var retiredCerts []*keymgr.AuthorityRecord
	if st != nil {
		for _, a := range st.Authorities {
			switch {
			case a.Key != nil:
				named[keymgr.KeyEntry(a.Cert)] = true
			case a.Phase == keymgr.PhaseRetired:
				retired[keymgr.KeyEntry(a.Cert)] = true
				retiredCerts = append(retiredCerts, a)
			}
		}
	}
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := f.Name()
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		info, err := f.Info()
		if err != nil {
			t.Fatal(err)
		}
		mode := info.Mode().Perm()
		switch {
		case bytes.Contains(data, []byte("PRIVATE KEY")) && mode != 0o600:
			t.Fatalf("%s holds a private key with mode %v, want 0600", name, mode)
		case name == dirstore.FileState && mode != 0o644:
			t.Fatalf("%s mode %v, want 0644", name, mode)
		case strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-"):
			l.temps = append(l.temps, name)
		case retired[name]:
			l.retiredKeys = append(l.retiredKeys, name)
		case strings.HasPrefix(name, "key-") && !named[name]:
			l.unnamedKeys = append(l.unnamedKeys, name)
		case name == keymgr.FileCAKey && len(retiredCerts) > 0:
			key, err := pemutil.ParsePrivateKey(data)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			for _, a := range retiredCerts {
				if csr.SamePublicKey(key.Public(), a.Cert.PublicKey) {
					l.retiredKeys = append(l.retiredKeys, name)
				}
			}
		}
		delete(named, name)
	}
	if _, err := os.Stat(filepath.Join(dir, dirstore.FileState)); err != nil {
		return l // the single-root layout: its key is ca-key.pem
	}
	for name := range named {
		t.Fatalf("the state names %s, which is not in the directory", name)
	}
	if st != nil {
		l.staleLayout = !layoutFollows(dir, st)
	}
	return l
}

// layoutFollows reports whether the cacerts layout of dir is that of st:
// root-cert.pem the bundle, ca-cert.pem and ca-key.pem the active
// authority's.
func layoutFollows(dir string, st *keymgr.State) bool {
	read := func(name string) []byte {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return b
	}
	active := st.Active()
	key, err := pemutil.ParsePrivateKey(read(keymgr.FileCAKey))
	return err == nil && csr.SamePublicKey(key.Public(), active.Cert.PublicKey) &&
		bytes.Equal(read(keymgr.FileCACert), pemutil.EncodeCertificates(active.Cert)) &&
		bytes.Equal(read(keymgr.FileRootCert), pemutil.EncodeCertificates(st.Bundle()...))
}

// TestCrashDirLock: the state directory's lock is a flock(2) on .lock,
// which the kernel lets go when its holder dies, so a `meshca root` step
// killed while it holds the lock (caught holding it in /proc/locks, then
// frozen and killed there), or while it waits for it, never blocks the
// next command: the lock is free at once and the next step succeeds.
func TestCrashDirLock(t *testing.T) {
	s := openCrashStore(t, "dir", "", "state")
	s.runStep(t, "prepare")
	lockFile := filepath.Join(s.dir, dirstore.FileLock)
	held := 0
	for i := range 6 {
		verb := rotation[i%len(rotation)]
		prev := s.load(t)
		cmd := exec.Command(bin, stepArgs(s, verb)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		caught := false
		for !caught && procState(cmd.Process.Pid) != "Z" {
			if !holdsFlock(cmd.Process.Pid, lockFile) {
				continue
			}
			freezeAndKill(t, cmd.Process.Pid, cmd.Process.Signal, func(pid int) { caught = holdsFlock(pid, lockFile) })
		}
		_ = cmd.Wait()
		start := time.Now()
		checkUnlocked(t, s.dir)
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("the lock of a killed %s took %v to take", verb, d)
		}
		next := s.load(t)
		got, err := stepBetween(prev, next)
		if err != nil {
			t.Fatalf("%s killed holding the lock: %v", verb, err)
		}
		if err := checkState(next); err != nil {
			t.Fatalf("%s killed holding the lock: %v", verb, err)
		}
		if caught {
			held++
		}
		if got == "" {
			s.runStep(t, verb)
		}
	}
	if held == 0 {
		t.Fatal("no step was caught holding the lock")
	}
	harness.Report(t, "%d of 6 steps killed holding the lock; the lock was free at once after each", held)

	// A step killed while it waits for the lock changes nothing.
	ctx := context.Background()
	unlock, err := dirstore.LockDir(ctx, s.dir)
	if err != nil {
		t.Fatal(err)
	}
	prev := s.load(t)
	cmd := exec.Command(bin, stepArgs(s, "prepare")...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if st := procState(cmd.Process.Pid); st == "Z" || st == "" {
		t.Fatal("prepare did not wait for the lock held in-process")
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	if got, err := stepBetween(prev, s.load(t)); err != nil || got != "" {
		t.Fatalf("prepare killed while waiting for the lock: step %q, %v; want none", got, err)
	}
	s.runStep(t, "prepare")
}
