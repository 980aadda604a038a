package shim

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// unquoteWords splits a command line the way a POSIX shell splits the
// part of it shellWords writes: words separated by spaces, each made of
// single-quoted strings and backslash-escaped characters. It fails on
// anything else outside quotes: a shell would treat it as syntax.
func unquoteWords(line string) ([]string, error) {
	var words []string
	var word strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			word.WriteByte(c)
		case c == '\'':
			quoted, inWord = true, true
		case c == '\\' && i+1 < len(line) && line[i+1] == '\'':
			word.WriteByte('\'')
			inWord = true
			i++
		case c == ' ':
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			return nil, errors.New("unquoted " + string(c) + " at " + line[:i])
		}
	}
	if quoted {
		return nil, errors.New("unterminated quote")
	}
	if inWord {
		words = append(words, word.String())
	}
	return words, nil
}

// FuzzShellWords: whatever the arguments, shellWords either refuses them
// (exactly when one holds a NUL) or writes words a shell splits back into
// exactly the arguments, with nothing outside quotes but escaped quotes
// and the spaces between words.
func FuzzShellWords(f *testing.F) {
	for _, seed := range [][3]string{
		{"sh", "-c", "echo hi"},
		{"it's", `"$HOME"`, "`id`"},
		{"", " ", "\n"},
		{"'", "''", `'\''`},
		{"a\x00b", "c", "d"},
		{"$(reboot)", "; rm -rf /", "*"},
		{"\xff\xfe", "\\", "\\'"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, a, b, c string) {
		args := []string{a, b, c}
		line, err := shellWords(args)
		hasNUL := strings.ContainsRune(a+b+c, 0)
		switch {
		case hasNUL && !errdefs.IsInvalidArgument(err):
			t.Fatalf("shellWords(%q) = %q, %v; want it refused", args, line, err)
		case hasNUL:
			return
		case err != nil:
			t.Fatalf("shellWords(%q): %v", args, err)
		}
		got, err := unquoteWords(line)
		if err != nil {
			t.Fatalf("shellWords(%q) = %q: %v", args, line, err)
		}
		if !slices.Equal(got, args) {
			t.Fatalf("shellWords(%q) = %q, which a shell reads as %q", args, line, got)
		}
	})
}
