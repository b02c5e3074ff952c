package main

import (
	"slices"
	"strings"
	"testing"
)

func TestCheckFuncs(t *testing.T) {
	body := func(n int) string { return strings.Repeat("\t_ = 0\n", n) }
	src := "package main\n\nfunc short() {\n" + body(58) + "}\n\ntype T struct{}\n\nfunc (t *T) long() {\n" + body(59) + "}\n"
	spans, err := funcSpans("cmd/x/a.go", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if want := []funcSpan{{"short", 60}, {"T.long", 61}}; !slices.Equal(spans, want) {
		t.Fatalf("funcSpans: got %v, want %v", spans, want)
	}
	limits := map[string]int{"cmd/": 60}
	tests := []struct {
		name  string
		files []sourceFile
		want  []string
	}{
		{name: "at and over the limit", files: []sourceFile{{Path: "cmd/x/a.go", Funcs: spans}},
			want: []string{"func: cmd/x/a.go: T.long has 61 lines; a function there may have at most 60: split it into named steps"}},
		{name: "tests are exempt", files: []sourceFile{{Path: "cmd/x/a_test.go", Funcs: spans}}},
		{name: "other folders are exempt", files: []sourceFile{{Path: "ca/a.go", Funcs: spans}}},
		{name: "generated is exempt", files: []sourceFile{{Path: "cmd/x/a.go", Funcs: spans, Generated: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkFuncs(tt.files, limits); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestFuncLimit(t *testing.T) {
	limits := map[string]int{"cmd/": 60, "cmd/meshca/": 50}
	for path, want := range map[string]int{"cmd/meshca/serve.go": 50, "cmd/other/main.go": 60, "ca/server.go": 0} {
		if got, _ := funcLimit(path, limits); got != want {
			t.Errorf("%s: limit %d, want %d", path, got, want)
		}
	}
}
