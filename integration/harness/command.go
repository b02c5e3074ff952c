package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildCommand builds a command of the integration module (pkg, such as
// "./cmd/attack") into dir, without the race detector whatever the
// tests run with, and returns its path: a process of its own that loads
// meshca costs what it would cost outside a test.
func BuildCommand(dir, pkg string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = filepath.Join(RepoRoot(), "integration")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}
