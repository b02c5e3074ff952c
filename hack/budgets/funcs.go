package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
)

// funcSpan is one function or method of a file and its length in lines.
type funcSpan struct {
	Name  string // "Name" or "Recv.Name"
	Lines int
}

// funcSpans parses src, the file at path, and returns its functions.
func funcSpans(path string, src []byte) ([]funcSpan, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []funcSpan
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		name := fd.Name.Name
		if fd.Recv != nil && len(fd.Recv.List) == 1 {
			name = recvName(fd.Recv.List[0].Type) + "." + name
		}
		lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
		out = append(out, funcSpan{Name: name, Lines: lines})
	}
	return out, nil
}

// recvName is a receiver type's name without its pointer or parameters.
func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

// funcLimit is the limit of the longest folder prefix in limits that holds
// path, a non-test file; ok is false when none does.
func funcLimit(path string, limits map[string]int) (limit int, ok bool) {
	if strings.HasSuffix(path, "_test.go") {
		return 0, false
	}
	best := ""
	for prefix, n := range limits {
		if strings.HasPrefix(path, prefix) && len(prefix) > len(best) {
			best, limit, ok = prefix, n, true
		}
	}
	return limit, ok
}

// checkFuncs reports every function longer than its folder's limit.
func checkFuncs(files []sourceFile, limits map[string]int) []string {
	var out []string
	for _, f := range files {
		limit, ok := funcLimit(f.Path, limits)
		if !ok || f.Generated {
			continue
		}
		for _, fn := range f.Funcs {
			if fn.Lines > limit {
				out = append(out, fmt.Sprintf("func: %s: %s has %d lines; a function there may have at most %d: split it into named steps", f.Path, fn.Name, fn.Lines, limit))
			}
		}
	}
	return out
}
