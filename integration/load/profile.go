package load

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
)

// Fetch saves http://admin+path (a /debug/pprof/ profile of a meshca run
// with --enable-pprof) to file.
func Fetch(admin, path, file string) error {
	resp, err := http.Get("http://" + admin + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Top prints `go tool pprof args...` under a title.
func Top(w io.Writer, title string, args ...string) error {
	fmt.Fprintf(w, "\n--- %s (go tool pprof %s)\n", title, strings.Join(args, " "))
	cmd := exec.Command("go", append([]string{"tool", "pprof"}, args...)...)
	cmd.Stdout, cmd.Stderr = w, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go tool pprof: %w", err)
	}
	return nil
}
