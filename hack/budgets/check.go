package main

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A sourceFile is one Go file of the repository, for the size budget.
type sourceFile struct {
	Path      string // relative to the repository root
	Lines     int
	Generated bool
	// Funcs are the file's functions and methods with their lengths;
	// only for files checkFuncs looks at (funcLimits).
	Funcs []funcSpan
}

// A pkg is one package of the product module, with the files go list
// builds for it.
type pkg struct {
	Path  string // full import path
	Files []goFile
}

// A goFile is one file of a pkg and the import paths it names.
type goFile struct {
	Path      string // relative to the repository root
	Test      bool   // a _test.go file, of the package or its external test package
	Generated bool
	Imports   []string
}

var generatedLine = regexp.MustCompile(`^// Code generated .* DO NOT EDIT\.$`)

// isGenerated reports whether src carries the standard marker line
// "// Code generated ... DO NOT EDIT." before its package clause.
func isGenerated(src []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if generatedLine.MatchString(line) {
			return true
		}
		if strings.HasPrefix(line, "package ") {
			return false
		}
	}
	return false
}

// countLines counts lines the way an editor numbers them.
func countLines(src []byte) int {
	n := bytes.Count(src, []byte("\n"))
	if len(src) > 0 && src[len(src)-1] != '\n' {
		n++
	}
	return n
}

// checkSizes reports every file not marked generated with more than max lines.
func checkSizes(files []sourceFile, max int) []string {
	var out []string
	for _, f := range files {
		if !f.Generated && f.Lines > max {
			out = append(out, fmt.Sprintf("size: %s has %d lines; a Go file not marked generated may have at most %d", f.Path, f.Lines, max))
		}
	}
	return out
}

// checkRequires reports each direct require of the product go.mod that
// allowed does not list.
func checkRequires(direct []string, allowed map[string]string) []string {
	var out []string
	for _, r := range direct {
		if _, ok := allowed[r]; !ok {
			out = append(out, fmt.Sprintf("go.mod: direct require %s is not in hack/budgets' allowedRequires: add it there with its reason", r))
		}
	}
	return out
}

// relPath returns path relative to module, and whether path is in module.
func relPath(module, path string) (string, bool) {
	if path == module {
		return ".", true
	}
	rest, ok := strings.CutPrefix(path, module+"/")
	return rest, ok
}

// matchScore tells how specifically pattern names rel: 0 for not at all,
// more for a longer "/..." pattern, most for an exact path.
func matchScore(pattern, rel string) int {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		if rel == base || strings.HasPrefix(rel, base+"/") {
			return 1 + len(base)
		}
		return 0
	}
	if rel == pattern {
		return 1 << 20
	}
	return 0
}

// layerOf returns the layer of rel, or nil if no layer names it.
func layerOf(ls []layer, rel string) *layer {
	var best *layer
	score := 0
	for i := range ls {
		for _, p := range ls[i].Pkgs {
			if s := matchScore(p, rel); s > score {
				best, score = &ls[i], s
			}
		}
	}
	return best
}

// checkLayers reports every import between packages of module that the
// layers do not allow: in non-test files, an import of a layer not in the
// importer's May list; in test files, an import of a layer in testDeny
// (other than the package itself); anywhere, a package of ours in no layer.
func checkLayers(module string, pkgs []pkg, ls []layer, testDeny []string) []string {
	var out []string
	for _, p := range pkgs {
		from, _ := relPath(module, p.Path)
		fl := layerOf(ls, from)
		if fl == nil {
			out = append(out, fmt.Sprintf("layers: package %s is in no layer; place it in hack/budgets/rules.go", from))
			continue
		}
		seen := map[string]bool{}
		for _, f := range p.Files {
			for _, imp := range f.Imports {
				to, ours := relPath(module, imp)
				if !ours || to == from || seen[f.Path+" "+to] {
					continue
				}
				seen[f.Path+" "+to] = true
				tl := layerOf(ls, to)
				switch {
				case tl == nil:
					out = append(out, fmt.Sprintf("layers: %s: package %s imports %s, which is in no layer; place it in hack/budgets/rules.go", f.Path, from, to))
				case f.Test && slices.Contains(testDeny, tl.Name):
					out = append(out, fmt.Sprintf("layers: %s: test of %s imports %s (layer %q); no code, tests included, may import layer %q: %s",
						f.Path, from, to, tl.Name, tl.Name, tl.Why))
				case !f.Test && !slices.Contains(fl.May, tl.Name):
					out = append(out, fmt.Sprintf("layers: %s: package %s imports %s (layer %q); layer %q may import only %s: %s",
						f.Path, from, to, tl.Name, fl.Name, mayList(fl.May), fl.Why))
				}
			}
		}
	}
	return out
}

func mayList(may []string) string {
	if len(may) == 0 {
		return "nothing of ours"
	}
	return "[" + strings.Join(may, ", ") + "]"
}

// checkStatus reports every non-test, non-generated file outside the
// allowed packages that imports statusImport.
func checkStatus(module string, pkgs []pkg, allowed []string) []string {
	var out []string
	for _, p := range pkgs {
		from, _ := relPath(module, p.Path)
		if slices.Contains(allowed, from) {
			continue
		}
		for _, f := range p.Files {
			if f.Test || f.Generated || !slices.Contains(f.Imports, statusImport) {
				continue
			}
			out = append(out, fmt.Sprintf("grpc/status: %s: package %s imports %s; only %s may (errors map to gRPC codes in one place, ca)",
				f.Path, from, statusImport, mayList(allowed)))
		}
	}
	return out
}
