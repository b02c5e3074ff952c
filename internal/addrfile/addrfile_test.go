package addrfile_test

import (
	"path/filepath"
	"testing"

	"github.com/meshca/meshca/internal/addrfile"
)

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "addr.json")
	want := addrfile.Addresses{GRPC: "127.0.0.1:15012", Admin: "127.0.0.1:15014"}
	if err := addrfile.Write(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := addrfile.Read(path)
	if err != nil || got != want {
		t.Fatalf("got %+v, %v", got, err)
	}
	if _, err := addrfile.Read(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing file read")
	}
}
