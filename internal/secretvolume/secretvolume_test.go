package secretvolume_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshca/meshca/internal/secretvolume"
)

// TestWrite: each version replaces the last whole, through the ..data
// link, and leaves no trace of the one before.
func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	for _, files := range []map[string][]byte{
		{"tls.crt": []byte("cert 1"), "tls.key": []byte("key 1"), "ca.crt": []byte("ca 1")},
		{"tls.crt": []byte("cert 2"), "tls.key": []byte("key 2")},
	} {
		if err := secretvolume.Write(dir, files); err != nil {
			t.Fatal(err)
		}
		for name, want := range files {
			got, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil || string(got) != string(want) {
				t.Errorf("%s = %q, %v; want %q", name, got, err, want)
			}
			if link, err := os.Readlink(filepath.Join(dir, name)); err != nil || link != filepath.Join("..data", name) {
				t.Errorf("%s links to %q (%v), want ..data/%s", name, link, err, name)
			}
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "ca.crt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ca.crt, gone from the second version, is still there: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	versions := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..") && e.Name() != "..data" {
			versions++
		}
	}
	if versions != 1 {
		t.Errorf("%d version directories, want the current one alone: %v", versions, entries)
	}
}
