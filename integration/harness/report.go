package harness

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// ReportEnv names the file that Report appends to. `make test-integration`
// sets it and prints the file when the tests end, so that the figures a
// test exists to show (handshakes checked, failures) reach CI's output,
// where go test keeps a passing package's logs to itself.
const ReportEnv = "MESHCA_TEST_REPORT"

// Report logs a figure of t's and, when $MESHCA_TEST_REPORT names a file,
// appends it there as one line led by the test's name. Packages run as
// processes of their own, side by side: each line is one write to a file
// opened for appending, so lines never interleave.
func Report(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	t.Log(msg)
	path := os.Getenv(ReportEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Errorf("report: %v", err)
		return
	}
	defer f.Close()
	line := t.Name() + ": " + strings.ReplaceAll(msg, "\n", " ") + "\n"
	if _, err := f.WriteString(line); err != nil {
		t.Errorf("report: %v", err)
	}
}
