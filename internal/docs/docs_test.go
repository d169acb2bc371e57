package docs

import (
	"encoding/json"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// root is the repository's root, found from this file's place in it.
func root(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "docs", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// pkgConst is one exported constant of a package, with its value.
type pkgConst struct {
	name, file string
	val        constant.Value
}

// constsOf parses the non-test Go files of dir (relative to the root) and
// returns their exported package-level constants with the values go/types
// would give them (iota and typed constants included, by go/constant on
// the literal or the iota index).
func constsOf(t *testing.T, dir string) []pkgConst {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(root(t), dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []pkgConst
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			var last []ast.Expr // an elided spec repeats the previous one's expressions
			for iota, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				if len(vs.Values) > 0 {
					last = vs.Values
				}
				for i, n := range vs.Names {
					if !n.IsExported() {
						continue
					}
					var v constant.Value = constant.MakeUnknown()
					if i < len(last) {
						v = eval(last[i], iota)
					}
					out = append(out, pkgConst{n.Name, filepath.Base(p), v})
				}
			}
		}
	}
	return out
}

// eval evaluates the constant expressions the wire package uses: literals,
// iota, shifts and the like; anything else is unknown.
func eval(e ast.Expr, iota int) constant.Value {
	switch e := e.(type) {
	case *ast.BasicLit:
		return constant.MakeFromLiteral(e.Value, e.Kind, 0)
	case *ast.Ident:
		if e.Name == "iota" {
			return constant.MakeInt64(int64(iota))
		}
	case *ast.ParenExpr:
		return eval(e.X, iota)
	case *ast.BinaryExpr:
		x, y := eval(e.X, iota), eval(e.Y, iota)
		if x.Kind() == constant.Unknown || y.Kind() == constant.Unknown {
			return constant.MakeUnknown()
		}
		if e.Op == token.SHL || e.Op == token.SHR {
			s, _ := constant.Uint64Val(y)
			return constant.Shift(x, e.Op, uint(s))
		}
		return constant.BinaryOp(x, e.Op, y)
	}
	return constant.MakeUnknown()
}

// documentedPrefixes are the constants of the wire package the protocol
// doc must name, with their values.
var documentedPrefixes = []string{"Op", "Code", "Stream", "Close", "Param", "Cap", "Session", "Kind"}

// TestRunnerProtocolNamesEveryConstant: every exported Op*, Code*,
// Stream*, Close*, Param*, Cap*, Session* and Kind* constant of
// provider/runner/wire, and each string constant's value, appears in
// docs/runner-protocol.md; so do the size limits (Max*, ReadLimit, Path).
// A constant added to the protocol without a word in the doc fails here.
func TestRunnerProtocolNamesEveryConstant(t *testing.T) {
	doc := readDoc(t, "runner-protocol.md")
	cs := constsOf(t, "provider/runner/wire")
	if len(cs) < 40 {
		t.Fatalf("found %d exported constants in provider/runner/wire: the parse is broken", len(cs))
	}
	seen := 0
	for _, c := range cs {
		prefixed := slices.ContainsFunc(documentedPrefixes, func(p string) bool { return strings.HasPrefix(c.name, p) })
		limit := strings.HasPrefix(c.name, "Max") || c.name == "ReadLimit" || c.name == "Path"
		if !prefixed && !limit {
			continue
		}
		seen++
		if !strings.Contains(doc, "`"+c.name+"`") {
			t.Errorf("%s (%s) is not named in docs/runner-protocol.md (as `%s`)", c.name, c.file, c.name)
		}
		switch c.val.Kind() {
		case constant.String:
			v := constant.StringVal(c.val)
			if !strings.Contains(doc, "`"+v+"`") {
				t.Errorf("%s's value %q does not appear in docs/runner-protocol.md (as `%s`)", c.name, v, v)
			}
		case constant.Int:
			if strings.HasPrefix(c.name, "Close") {
				v := c.val.ExactString()
				if !regexp.MustCompile(`\b` + v + `\b`).MatchString(doc) {
					t.Errorf("%s's code %s does not appear in docs/runner-protocol.md", c.name, v)
				}
			}
		}
	}
	t.Logf("%d constants of provider/runner/wire checked against docs/runner-protocol.md", seen)
}

// TestRunnerProtocolNamesEveryField: every JSON field of the wire types
// (requests, limits, list_sessions entries, capacity reports) appears in
// the doc in backquotes.
func TestRunnerProtocolNamesEveryField(t *testing.T) {
	doc := readDoc(t, "runner-protocol.md")
	fset := token.NewFileSet()
	paths, _ := filepath.Glob(filepath.Join(root(t), "provider/runner/wire", "*.go"))
	n := 0
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(node ast.Node) bool {
			ts, ok := node.(*ast.TypeSpec)
			if !ok || !ts.Name.IsExported() {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, fl := range st.Fields.List {
				if fl.Tag == nil {
					continue
				}
				tag, _ := strconv.Unquote(fl.Tag.Value)
				name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
				if name == "" || name == "-" {
					continue
				}
				n++
				if !strings.Contains(doc, "`"+name+"`") {
					t.Errorf("field %q of wire.%s is not in docs/runner-protocol.md", name, ts.Name.Name)
				}
			}
			return true
		})
	}
	if n < 30 {
		t.Fatalf("found %d JSON fields in provider/runner/wire: the parse is broken", n)
	}
}

// TestAPIDocListsEveryRoute: docs/api.md links the OpenAPI document and
// names every operation in it as "METHOD PATH".
func TestAPIDocListsEveryRoute(t *testing.T) {
	doc := readDoc(t, "api.md")
	if !strings.Contains(doc, "../platform/api/openapi.json") {
		t.Error("docs/api.md does not link ../platform/api/openapi.json")
	}
	b, err := os.ReadFile(filepath.Join(root(t), "platform/api/openapi.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	n := 0
	for path, ops := range spec.Paths {
		for m := range ops {
			switch m {
			case "get", "put", "post", "delete", "patch", "options", "head":
			default:
				continue // parameters, summary
			}
			n++
			want := strings.ToUpper(m) + " " + path
			if !strings.Contains(doc, want) {
				t.Errorf("docs/api.md does not name %s", want)
			}
		}
	}
	if n < 20 {
		t.Fatalf("%d operations in openapi.json: the parse is broken", n)
	}
}

// pathRef finds the repository paths a doc names in backquotes:
// cmd/..., provider/..., and so on, ending in a file or a directory.
var pathRef = regexp.MustCompile("`((?:cmd|provider|runner|platform|sandbox|mechanism|image|internal|deploy|docs|mcpserver|examples)/[A-Za-z0-9_./@-]*)`")

// TestDocsNameOnlyFilesThatExist: every repository path a doc in docs/
// names in backquotes exists, so a file moved or renamed (a package
// split, say) leaves no doc pointing at nothing.
func TestDocsNameOnlyFilesThatExist(t *testing.T) {
	docs, _ := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
	if len(docs) < 5 {
		t.Fatalf("docs/ holds %d documents, want at least 5", len(docs))
	}
	n := 0
	for _, d := range docs {
		b, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range pathRef.FindAllStringSubmatch(string(b), -1) {
			p := strings.TrimSuffix(m[1], "/")
			if strings.ContainsAny(p, "*") {
				continue
			}
			n++
			if _, err := os.Stat(filepath.Join(root(t), p)); err != nil {
				t.Errorf("%s names %s, which does not exist", filepath.Base(d), p)
			}
		}
	}
	t.Logf("%d paths named in docs/ exist", n)
}

// TestDocsLinksResolve: every relative Markdown link in docs/*.md points
// at a file that exists (anchors are not checked).
func TestDocsLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	docs, _ := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
	for _, d := range docs {
		b, _ := os.ReadFile(d)
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(d), target)); err != nil {
				t.Errorf("%s links %s, which does not exist", filepath.Base(d), target)
			}
		}
	}
}

// TestDocsSpeakOfThisProject: docs name the systems managoat grew from by
// name (Fountain's daemon, the Elixir library), never "the original".
func TestDocsSpeakOfThisProject(t *testing.T) {
	docs, _ := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
	for _, d := range docs {
		b, _ := os.ReadFile(d)
		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(strings.ToLower(line), "the original") {
				t.Errorf("%s:%d says \"the original\": name what is meant", filepath.Base(d), i+1)
			}
		}
	}
}

// table returns the rows of the Markdown table in doc whose header's
// first cell is first, as maps from header to cell, keyed by first cell.
func table(t *testing.T, doc, first string) (header []string, rows map[string]map[string]string) {
	t.Helper()
	rows = map[string]map[string]string{}
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		cells := splitRow(lines[i])
		if len(cells) == 0 || cells[0] != first || header != nil {
			continue
		}
		header = cells
		for j := i + 2; j < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[j]), "|"); j++ {
			r := splitRow(lines[j])
			m := map[string]string{}
			for k, c := range r {
				if k < len(header) {
					m[header[k]] = c
				}
			}
			rows[r[0]] = m
		}
	}
	if header == nil {
		t.Fatalf("no table with a %q column", first)
	}
	return header, rows
}

func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") {
		return nil
	}
	parts := strings.Split(strings.Trim(line, "|"), "|")
	for i, p := range parts {
		parts[i] = strings.Trim(strings.TrimSpace(p), "`")
	}
	return parts
}

// exportedInterfaces lists the exported interface types of a package dir.
func exportedInterfaces(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	paths, _ := filepath.Glob(filepath.Join(root(t), dir, "*.go"))
	var out []string
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				if _, ok := ts.Type.(*ast.InterfaceType); ok && ts.Name.IsExported() {
					out = append(out, ts.Name.Name)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestAPIDocNamesEveryStreamMessage: every message type of the stream
// WebSocket (platform/api's Msg* constants) appears in docs/api.md, as
// "type": "<value>" or `<value>`.
func TestAPIDocNamesEveryStreamMessage(t *testing.T) {
	doc := readDoc(t, "api.md")
	n := 0
	for _, c := range constsOf(t, "platform/api") {
		if !strings.HasPrefix(c.name, "Msg") || c.val.Kind() != constant.String {
			continue
		}
		n++
		v := constant.StringVal(c.val)
		if !strings.Contains(doc, "`"+v+"`") && !strings.Contains(doc, `"type": "`+v+`"`) {
			t.Errorf("stream message %s (%q) is not in docs/api.md", c.name, v)
		}
	}
	if n < 6 {
		t.Fatalf("%d stream message types in platform/api: the parse is broken", n)
	}
}
