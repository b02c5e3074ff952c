package atomicfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshca/meshca/internal/atomicfile"
)

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key.pem")
	for _, content := range []string{"first", "second, longer content"} {
		if err := atomicfile.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != content {
			t.Fatalf("content = %q, want %q", got, content)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("mode = %v, want 0600", fi.Mode().Perm())
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
}

func TestWriteFileMissingDir(t *testing.T) {
	err := atomicfile.WriteFile(filepath.Join(t.TempDir(), "nope", "f"), []byte("x"), 0o644)
	if err == nil {
		t.Fatal("want an error for a missing directory")
	}
}
