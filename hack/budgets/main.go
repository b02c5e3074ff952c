// Command budgets enforces the budgets of meshca's design that the
// compiler does not: no Go file not marked generated over 500 lines, in any
// module of the repository; no function over its folder's limit (cmd/: 60
// lines); only allowed direct requires (each with its reason) in the product
// go.mod; google.golang.org/grpc/status imported only by ca and ca/caclient;
// no import against the package layering, in the default build nor in
// the HSM build's files (build tag pkcs11). The rules are data, in
// rules.go.
//
// Run it from the repository root, as make check does:
//
//	go run ./hack/budgets
//
// It prints one line per violation, naming the file or the importing and
// imported packages and the rule, and exits 1 if there is any.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

func main() {
	root := flag.String("root", ".", "repository root, holding the product go.mod")
	flag.Parse()
	if err := run(*root, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "budgets:", err)
		os.Exit(1)
	}
}

func run(root string, stdout, stderr io.Writer) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	files, err := walkGoFiles(root)
	if err != nil {
		return err
	}
	module, direct, err := readGoMod(root)
	if err != nil {
		return err
	}
	pkgs, err := listPackages(root, module)
	if err != nil {
		return err
	}
	var problems []string
	problems = append(problems, checkSizes(files, maxLines)...)
	problems = append(problems, checkFuncs(files, funcLimits)...)
	problems = append(problems, checkRequires(direct, allowedRequires)...)
	problems = append(problems, checkLayers(module, pkgs, layers, testMayNotImport)...)
	problems = append(problems, checkStatus(module, pkgs, statusImporters)...)
	if len(problems) > 0 {
		sort.Strings(problems)
		for _, p := range problems {
			fmt.Fprintln(stderr, p)
		}
		return fmt.Errorf("%d violation(s) of the budgets in hack/budgets/rules.go", len(problems))
	}
	generated := 0
	for _, f := range files {
		if f.Generated {
			generated++
		}
	}
	fmt.Fprintf(stdout, "budgets: ok: %d Go files (%d generated, exempt) within %d lines; %d direct requires (%d allowed); %d packages within their layers; %s only in %s\n",
		len(files), generated, maxLines, len(direct), len(allowedRequires), len(pkgs), statusImport, strings.Join(statusImporters, ", "))
	return nil
}

// walkGoFiles reads every .go file under root, in every module, skipping
// directories the go command ignores (names starting with "." or "_").
func walkGoFiles(root string) ([]sourceFile, error) {
	var out []sourceFile
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || !d.Type().IsRegular() {
			return nil
		}
		src, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed while we walked
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		f := sourceFile{Path: filepath.ToSlash(rel), Lines: countLines(src), Generated: isGenerated(src)}
		if _, limited := funcLimit(f.Path, funcLimits); limited && !f.Generated {
			if f.Funcs, err = funcSpans(path, src); err != nil {
				return err
			}
		}
		out = append(out, f)
		return nil
	})
	return out, err
}

// readGoMod returns the product module's path and its direct requires.
func readGoMod(root string) (string, []string, error) {
	out, err := goCmd(root, "mod", "edit", "-json")
	if err != nil {
		return "", nil, err
	}
	var m struct {
		Module  struct{ Path string }
		Require []struct {
			Path     string
			Indirect bool
		}
	}
	if err := json.Unmarshal(out, &m); err != nil {
		return "", nil, fmt.Errorf("go mod edit -json: %w", err)
	}
	var direct []string
	for _, r := range m.Require {
		if !r.Indirect {
			direct = append(direct, r.Path)
		}
	}
	return m.Module.Path, direct, nil
}

// listPackages lists the product module's packages with go list, once
// for each of buildTags, and reads the imports of each of their files:
// a file of any build is checked.
func listPackages(root, module string) ([]pkg, error) {
	var pkgs []pkg
	index := map[string]int{} // package path → index in pkgs
	seen := map[string]bool{} // files already read
	for _, tags := range buildTags {
		listed, err := listBuild(root, module, tags)
		if err != nil {
			return nil, err
		}
		for _, lp := range listed {
			i, ok := index[lp.ImportPath]
			if !ok {
				i = len(pkgs)
				index[lp.ImportPath] = i
				pkgs = append(pkgs, pkg{Path: lp.ImportPath})
			}
			for _, f := range lp.files {
				path := filepath.Join(lp.Dir, f.name)
				if seen[path] {
					continue
				}
				seen[path] = true
				gf, err := readGoFile(root, path, f.test)
				if err != nil {
					return nil, err
				}
				pkgs[i].Files = append(pkgs[i].Files, gf)
			}
		}
	}
	return pkgs, nil
}

// A listedPkg is one package of the product module as go list sees it
// in one build.
type listedPkg struct {
	ImportPath, Dir string
	files           []listedFile
}

type listedFile struct {
	name string
	test bool
}

// listBuild lists the product module's packages in the build of tags.
func listBuild(root, module, tags string) ([]listedPkg, error) {
	out, err := goCmd(root, "list", "-e", "-tags="+tags, "-json=ImportPath,Dir,GoFiles,CgoFiles,TestGoFiles,XTestGoFiles", "./...")
	if err != nil {
		return nil, err
	}
	var pkgs []listedPkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var lp struct {
			ImportPath, Dir                              string
			GoFiles, CgoFiles, TestGoFiles, XTestGoFiles []string
		}
		if err := dec.Decode(&lp); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list: %w", err)
		}
		if _, ours := relPath(module, lp.ImportPath); !ours {
			continue
		}
		p := listedPkg{ImportPath: lp.ImportPath, Dir: lp.Dir}
		for _, set := range []struct {
			names []string
			test  bool
		}{{lp.GoFiles, false}, {lp.CgoFiles, false}, {lp.TestGoFiles, true}, {lp.XTestGoFiles, true}} {
			for _, name := range set.names {
				p.files = append(p.files, listedFile{name, set.test})
			}
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

func readGoFile(root, path string, test bool) (goFile, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return goFile{}, err
	}
	rel, err := filepath.Rel(root, path)
	if err != nil {
		return goFile{}, err
	}
	f := goFile{Path: filepath.ToSlash(rel), Test: test, Generated: isGenerated(src)}
	ast, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ImportsOnly)
	if err != nil {
		return goFile{}, err
	}
	for _, spec := range ast.Imports {
		imp, err := strconv.Unquote(spec.Path.Value)
		if err != nil {
			return goFile{}, fmt.Errorf("%s: %w", f.Path, err)
		}
		f.Imports = append(f.Imports, imp)
	}
	return f, nil
}

func goCmd(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
