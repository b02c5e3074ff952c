package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"sigs.k8s.io/yaml"
)

// exposition is one scrape of meshca's /metrics: each family's type, and
// every sample.
type exposition struct {
	types   map[string]string // family name → counter, gauge, histogram, ...
	samples []metricSample
}

type metricSample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrapeMetrics reads /metrics from meshca's admin address.
func scrapeMetrics(t *testing.T, adminAddr string) *exposition {
	t.Helper()
	r, err := getMetrics(adminAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", r.Status)
	}
	e, err := parseExposition(r.Body)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return e
}

// getMetrics GETs /metrics, and again for up to 5 s while the admin
// server refuses the connection: the attack rows fill its connection
// caps on purpose, and connections a row closed are freed only once
// the server has read their end, which a loaded machine delays.
func getMetrics(adminAddr string) (*http.Response, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := http.Get("http://" + adminAddr + "/metrics")
		if err == nil || time.Now().After(deadline) {
			return r, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// parseExposition reads the Prometheus text format, enough of it for
// client_golang's output: # TYPE lines and samples with quoted labels.
func parseExposition(r io.Reader) (*exposition, error) {
	e := &exposition{types: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			e.types[f[2]] = f[3]
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("%w in %q", err, line)
		}
		e.samples = append(e.samples, s)
	}
	return e, sc.Err()
}

func parseSample(line string) (metricSample, error) {
	s := metricSample{labels: map[string]string{}}
	end := strings.IndexAny(line, "{ ")
	if end < 0 {
		return s, fmt.Errorf("no value")
	}
	s.name, line = line[:end], line[end:]
	if strings.HasPrefix(line, "{") {
		line = line[1:]
		for !strings.HasPrefix(line, "}") {
			eq := strings.Index(line, `="`)
			if eq < 0 {
				return s, fmt.Errorf("malformed labels")
			}
			key := strings.TrimPrefix(line[:eq], ",")
			v, n, err := unquotePrefix(line[eq+1:])
			if err != nil {
				return s, err
			}
			s.labels[key], line = v, strings.TrimPrefix(line[eq+1+n:], ",")
		}
		line = line[1:]
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return s, fmt.Errorf("no value")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	s.value = v
	return s, err
}

// unquotePrefix unquotes the quoted string s starts with and reports how
// many bytes it took.
func unquotePrefix(s string) (string, int, error) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			v, err := strconv.Unquote(s[:i+1])
			return v, i + 1, err
		}
	}
	return "", 0, fmt.Errorf("unterminated label value")
}

// exports reports whether name is exported: a family of that name, or
// the _bucket, _sum or _count series of a histogram or summary.
func (e *exposition) exports(name string) bool {
	if _, ok := e.types[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if typ := e.types[base]; typ == "histogram" || typ == "summary" {
				return true
			}
		}
	}
	return false
}

// value returns the value of the one sample of name whose labels include
// labels, and whether there is exactly one.
func (e *exposition) value(name string, labels map[string]string) (float64, bool) {
	var found []float64
	for _, s := range e.samples {
		if s.name != name {
			continue
		}
		match := true
		for k, v := range labels {
			if s.labels[k] != v {
				match = false
				break
			}
		}
		if match {
			found = append(found, s.value)
		}
	}
	if len(found) != 1 {
		return 0, false
	}
	return found[0], true
}

var (
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlOurNames = regexp.MustCompile(`\b(?:meshca|citadel|grpc)_[A-Za-z0-9_:]*`)
)

// promqlMetricNames extracts, crudely, the metric names expr uses: the
// identifiers with meshca's, Istio's or gRPC's prefix outside strings,
// label matchers and grouping clauses (where grpc_code is a label).
func promqlMetricNames(expr string) []string {
	expr = promqlString.ReplaceAllString(expr, `""`)
	expr = promqlMatchers.ReplaceAllString(expr, "")
	expr = promqlGrouping.ReplaceAllString(expr, "")
	return promqlOurNames.FindAllString(expr, -1)
}

// chartFile reads a file of the chart's files/ folder.
func chartFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "deploy", "charts", "meshca", "files", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dashboardPanel is what dashboardQueries reads of a panel: its
// queries, and the panels of a row.
type dashboardPanel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

// promQuery is a PromQL query of the dashboard or the alerts, and where
// it is.
type promQuery struct {
	where, expr string
}

// dashboardQueries returns every PromQL query of the Grafana dashboard:
// the panels' targets and the query variables' queries.
func dashboardQueries(t *testing.T) []promQuery {
	t.Helper()
	var d struct {
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"` // a string, or {query: ...}
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(chartFile(t, "dashboard.json"), &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	var out []promQuery
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			for _, q := range p.Targets {
				out = append(out, promQuery{fmt.Sprintf("dashboard panel %q", p.Title), q.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		where := "dashboard variable $" + v.Name
		switch q := v.Query.(type) {
		case string:
			if v.Type == "query" {
				out = append(out, promQuery{where, q})
			}
		case map[string]any:
			if s, ok := q["query"].(string); ok {
				out = append(out, promQuery{where, s})
			}
		}
	}
	return out
}

// alertExpressions returns the expression of every rule of alerts.yaml.
func alertExpressions(t *testing.T) []promQuery {
	t.Helper()
	var f struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(chartFile(t, "alerts.yaml"), &f); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	var out []promQuery
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, promQuery{fmt.Sprintf("alert %s (group %s)", r.Alert, g.Name), r.Expr})
		}
	}
	return out
}

// TestMetricsPromQLNames: the crude extraction finds the metric names and
// nothing else (labels, strings, functions), and exports knows a
// histogram's series and a counter whose own name ends in _count.
func TestMetricsPromQLNames(t *testing.T) {
	for _, tt := range []struct {
		expr string
		want string
	}{
		{`sum by (grpc_code) (rate(grpc_server_handled_total{grpc_method="CreateCertificate"}[5m])) > 0`, "grpc_server_handled_total"},
		{`histogram_quantile(0.99, sum by (le, grpc_method) (rate(grpc_server_handling_seconds_bucket{job=~"$job"}[$__rate_interval])))`, "grpc_server_handling_seconds_bucket"},
		{`sum(rate(meshca_sign_errors_total{kind="unavailable"}[5m])) / sum(rate(meshca_sign_duration_seconds_count[5m]))`, "meshca_sign_errors_total meshca_sign_duration_seconds_count"},
		{`label_values(citadel_server_csr_count{job=~"$job"}, instance)`, "citadel_server_csr_count"},
		{`meshca_leader * on (grpc_x) group_left (meshca_y) label_replace(vector(1), "grpc_code", "meshca_z", "", "")`, "meshca_leader"},
	} {
		if got := strings.Join(promqlMetricNames(tt.expr), " "); got != tt.want {
			t.Errorf("promqlMetricNames(%q) = %q, want %q", tt.expr, got, tt.want)
		}
	}
	e, err := parseExposition(strings.NewReader(`# TYPE citadel_server_csr_count counter
citadel_server_csr_count 2
# TYPE meshca_sign_duration_seconds histogram
meshca_sign_duration_seconds_bucket{backend="local",le="+Inf"} 1
meshca_sign_duration_seconds_count{backend="local"} 1
# TYPE meshca_requests_total counter
meshca_requests_total{code="OK",reason="a \"quoted\", {odd} reason"} 1
`))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"citadel_server_csr_count": true, "meshca_sign_duration_seconds_bucket": true, "meshca_sign_duration_seconds_count": true,
		"meshca_requests_total": true, "citadel_server_csr": false, "meshca_requests": false, "meshca_vault_logged_in": false,
	} {
		if e.exports(name) != want {
			t.Errorf("exports(%s) = %v, want %v", name, !want, want)
		}
	}
	if v, ok := e.value("meshca_requests_total", map[string]string{"reason": `a "quoted", {odd} reason`}); !ok || v != 1 {
		t.Errorf("value of the sample with an odd label = %v, %v", v, ok)
	}
}
