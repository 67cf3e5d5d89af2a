// Package examples_test holds the test that keeps README.md's Go code true:
// every ```go block in it is taken from a program or test file under this
// repository that the tests compile and run, and the block's preceding line
// names that file. A block with a package clause must be the whole file,
// so that it works when pasted; any other block must appear in the
// file line for line (indentation aside). It reads only files: no service.
package examples_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// block is one fenced code block of a Markdown file.
type block struct {
	lang string
	line int    // 1-based line of the opening fence
	name string // the last non-blank line before the fence
	body string
}

// fences returns the fenced code blocks of Markdown text.
func fences(text string) ([]block, error) {
	var (
		out  []block
		cur  *block
		prev string
		body strings.Builder
	)
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &block{lang: strings.TrimSpace(strings.TrimPrefix(l, "```")), line: n, name: prev}
			body.Reset()
		case cur != nil && strings.TrimSpace(l) == "```":
			cur.body = body.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(l + "\n")
		case strings.TrimSpace(l) != "":
			prev = l
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: the fence is never closed", cur.line)
	}
	return out, sc.Err()
}

// goFile finds the repository-relative path of a .go file in s.
var goFile = regexp.MustCompile(`[A-Za-z0-9_./-]+\.go\b`)

// packageClause finds a Go file's package clause.
var packageClause = regexp.MustCompile(`(?m)^package [A-Za-z_]`)

// dedent trims each line's leading whitespace and drops trailing blank
// lines.
func dedent(s string) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimLeft(strings.TrimRight(l, " \t"), " \t")
	}
	return lines
}

// contains reports whether want appears in have as a run of whole lines.
func contains(have, want []string) bool {
	for i := 0; i+len(want) <= len(have); i++ {
		j := 0
		for j < len(want) && have[i+j] == want[j] {
			j++
		}
		if j == len(want) {
			return true
		}
	}
	return false
}

// checkGoBlocks returns what is wrong with the ```go blocks of the Markdown
// text, reading the files they name from root.
func checkGoBlocks(text, root string) ([]string, error) {
	blocks, err := fences(text)
	if err != nil {
		return nil, err
	}
	var problems []string
	for _, b := range blocks {
		if b.lang != "go" {
			continue
		}
		path := goFile.FindString(b.name)
		if path == "" {
			problems = append(problems, fmt.Sprintf("line %d: the ```go block's preceding line (%q) names no .go file it is taken from", b.line, b.name))
			continue
		}
		src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
		if err != nil {
			problems = append(problems, fmt.Sprintf("line %d: %v", b.line, err))
			continue
		}
		if packageClause.MatchString(b.body) {
			if b.body != string(src) {
				problems = append(problems, fmt.Sprintf("line %d: the block has a package clause but is not the whole of %s, byte for byte", b.line, path))
			}
			continue
		}
		if !contains(dedent(string(src)), dedent(b.body)) {
			problems = append(problems, fmt.Sprintf("line %d: the block does not appear line for line in %s", b.line, path))
		}
	}
	return problems, nil
}

func TestREADMEGoBlocksAreTestedCode(t *testing.T) {
	text, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	problems, err := checkGoBlocks(string(text), "..")
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	for _, p := range problems {
		t.Errorf("README.md:%s", p)
	}
	if n := strings.Count(string(text), "\n```go\n"); n < 2 {
		t.Errorf("README.md has %d ```go blocks; want at least the two of \"Use it\"", n)
	}
}

// The check itself: a block that drifts from its file, names none, or is
// a whole program that is not the whole file, is reported.
func TestCheckGoBlocks(t *testing.T) {
	dir := t.TempDir()
	const prog = "package main\n\nfunc main() {\n\tprintln(\"hi\")\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, md, want string // want: a substring of the one problem, or "" for none
	}{
		{"whole file", "From `p.go`:\n\n```go\n" + prog + "```\n", ""},
		{"excerpt, other indentation", "[p.go](p.go):\n```go\nprintln(\"hi\")\n}\n```\n", ""},
		{"not a go block", "```\nanything\n```\n", ""},
		{"drifted excerpt", "p.go:\n```go\nprintln(\"bye\")\n```\n", "does not appear line for line in p.go"},
		{"lines out of order", "p.go:\n```go\n}\nprintln(\"hi\")\n```\n", "does not appear line for line"},
		{"partial program", "p.go:\n```go\npackage main\n\nfunc main() {\n}\n```\n", "not the whole of p.go"},
		{"program with its doc comment, partial", "p.go:\n```go\n// Command p.\npackage main\n```\n", "not the whole of p.go"},
		{"no file named", "Use it:\n```go\nprintln(\"hi\")\n```\n", "names no .go file"},
		{"missing file", "q.go:\n```go\nprintln(\"hi\")\n```\n", "q.go"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			problems, err := checkGoBlocks(tc.md, dir)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want == "" && len(problems) > 0:
				t.Errorf("problems %q, want none", problems)
			case tc.want != "" && (len(problems) != 1 || !strings.Contains(problems[0], tc.want)):
				t.Errorf("problems %q, want one with %q", problems, tc.want)
			}
		})
	}
}

// Every program under examples/ is run by a test of its own, so that what
// the README and the programs' comments promise is checked.
func TestEveryProgramIsRun(t *testing.T) {
	mains, err := filepath.Glob("*/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(mains) == 0 {
		t.Fatal("no programs found")
	}
	for _, m := range mains {
		if _, err := os.Stat(filepath.Join(filepath.Dir(m), "main_test.go")); err != nil {
			t.Errorf("examples/%s has no main_test.go running it: %v", filepath.Dir(m), err)
		}
	}
}
