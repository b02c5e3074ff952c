package load

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// Category names a share of a CPU profile: the samples with a frame
// containing any of Frames and no earlier category.
type Category struct {
	Name   string
	Frames []string
}

// MeshcaCategories split meshca's CPU among the steps of a request and
// what carries it, the raw work first.
var MeshcaCategories = []Category{
	{"raw: sign the leaf (x509.CreateCertificate)", []string{"crypto/x509.CreateCertificate"}},
	{"raw: parse and verify the CSR", []string{"meshca/csr.ParseFor"}},
	{"parse the issued leaf", []string{"crypto/x509.ParseCertificate"}},
	{"signer backend: HTTP, JSON, PEM", []string{"meshca/signer/vault.", "meshca/signer/cfssl."}},
	{"verify the issued chain", []string{"meshca/ca.(*issuedChains)", "x509svid.Verify"}},
	{"audit log", []string{"meshca/ca.(*AuditLog)"}},
	{"authenticate, authorize, CSR policy, reply", []string{"meshca/ca.(*Server).serve"}},
	{"gRPC transport and TLS", []string{"grpc/internal/transport.", "crypto/tls."}},
	{"gRPC handler, interceptors, metrics", []string{"google.golang.org/grpc."}},
	{"garbage collection", []string{"runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge", "runtime.gcAssist"}},
	{"other", []string{""}},
}

// Share is a category's CPU time in a profile.
type Share struct {
	Name     string
	CPU      time.Duration
	Fraction float64
}

// Breakdown splits the samples of CPU profiles (merged) among
// categories, in their order (`go tool pprof -traces`).
func Breakdown(categories []Category, profiles ...string) ([]Share, error) {
	out, err := exec.Command("go", append([]string{"tool", "pprof", "-traces"}, profiles...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof -traces: %w", err)
	}
	return breakdown(bytes.NewReader(out), categories)
}

func breakdown(r io.Reader, categories []Category) ([]Share, error) {
	shares := make([]Share, len(categories))
	for i, c := range categories {
		shares[i].Name = c.Name
	}
	var total time.Duration
	var value time.Duration
	var frames []string
	flush := func() {
		if value == 0 {
			return
		}
		total += value
		for i, c := range categories {
			if matches(frames, c.Frames) {
				shares[i].CPU += value
				break
			}
		}
		value, frames = 0, frames[:0]
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "-----------+"):
			flush()
		case strings.HasPrefix(line, "      ") || strings.HasPrefix(line, "     "):
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			if d, err := time.ParseDuration(f[0]); err == nil && value == 0 && len(f) > 1 {
				value, frames = d, append(frames, f[1])
				continue
			}
			frames = append(frames, f[0])
		}
	}
	flush()
	if total == 0 {
		return nil, fmt.Errorf("no samples in the profile")
	}
	for i := range shares {
		shares[i].Fraction = float64(shares[i].CPU) / float64(total)
	}
	return shares, sc.Err()
}

func matches(frames, patterns []string) bool {
	for _, f := range frames {
		for _, p := range patterns {
			if strings.Contains(f, p) {
				return true
			}
		}
	}
	return false
}

// PrintBreakdown prints shares, with each one's CPU per request when n
// requests were served while the profile ran.
func PrintBreakdown(w io.Writer, shares []Share, n int) {
	for _, s := range shares {
		if s.CPU == 0 {
			continue
		}
		per := ""
		if n > 0 {
			per = fmt.Sprintf("%7.0f µs/req", float64(s.CPU.Nanoseconds())/1000/float64(n))
		}
		fmt.Fprintf(w, "  %5.1f%%  %s  %s\n", 100*s.Fraction, per, s.Name)
	}
}
