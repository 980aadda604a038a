package image

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The files of a pointer image: an image whose /disk holds these two and
// no disk, so that the disk is downloaded from the URL instead.
const (
	PointerURLFile    = "/disk/disk.url"    // one http or https URL
	PointerSHA256File = "/disk/disk.sha256" // the disk's sha256: the digest alone, or sha256sum output
)

// MaxPointerFileSize is the most bytes a pointer file may hold.
const MaxPointerFileSize = 4 << 10

// MaxURLLength is the most bytes of a pointer's URL.
const MaxURLLength = 4096

// maxQuoted is how many bytes of text from an image an error quotes.
const maxQuoted = 64

// ParsePointer checks the contents of a pointer image's two files and
// returns the URL, trimmed, and the sha256 digest, as 64 lowercase hex
// digits. urlText is one line holding an http or https URL with a host and
// no fragment, of at most MaxURLLength bytes, with no spaces or control
// characters (the rules of the vmshim.io/disk-url annotation); sumText is the
// digest alone, optionally prefixed "sha256:", or the line sha256sum
// writes ("HEX  name"). Both are UTF-8 of at most MaxPointerFileSize
// bytes; surrounding whitespace is ignored.
// Errors are one line, name the file, and are errdefs.ErrInvalidArgument.
// Only the syntax is checked: nothing is looked up or downloaded.
func ParsePointer(urlText, sumText []byte) (diskURL, sum string, err error) {
	if diskURL, err = parseURL(urlText); err != nil {
		return "", "", err
	}
	if sum, err = parseSHA256(sumText); err != nil {
		return "", "", err
	}
	return diskURL, sum, nil
}

// pointerLine returns the one line of text of the pointer file name, at
// most MaxPointerFileSize bytes of UTF-8, blanks around it trimmed; want
// and one say what it should hold, for the errors.
func pointerLine(name string, text []byte, want, one string) (string, error) {
	if len(text) > MaxPointerFileSize {
		return "", invalidf("%s: larger than %d bytes", name, MaxPointerFileSize)
	}
	if !utf8.Valid(text) {
		return "", invalidf("%s: not valid UTF-8", name)
	}
	s := strings.TrimSpace(string(text))
	switch {
	case s == "":
		return "", invalidf("%s: empty; want %s", name, want)
	case strings.ContainsAny(s, "\r\n"):
		return "", invalidf("%s: more than one line; want %s", name, one)
	}
	return s, nil
}

// parseURL checks the text of PointerURLFile.
func parseURL(text []byte) (string, error) {
	const name = "pointer file " + PointerURLFile
	s, err := pointerLine(name, text, "an http or https URL", "one URL")
	if err != nil {
		return "", err
	}
	switch {
	case len(s) > MaxURLLength:
		return "", invalidf("%s: URL of %d bytes; at most %d are allowed", name, len(s), MaxURLLength)
	}
	for i, r := range s {
		if r == ' ' || r == utf8.RuneError || !unicode.IsPrint(r) {
			return "", invalidf("%s: URL has %s at byte %d; spaces and control characters must be percent-encoded", name, describeURLRune(r), i)
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the url.Error repeats the whole URL
		}
		return "", invalidf("%s: not a URL: %s", name, capMessage(err.Error(), 2*maxQuoted))
	}
	switch {
	case u.Scheme == "":
		return "", invalidf("%s: URL %s has no scheme; want http or https", name, quoteFromImage(s))
	case u.Scheme != "http" && u.Scheme != "https":
		return "", invalidf("%s: URL scheme %s is not http or https", name, quoteFromImage(u.Scheme))
	case u.Opaque != "" || u.Hostname() == "":
		return "", invalidf("%s: URL %s has no host", name, quoteFromImage(s))
	case strings.Contains(s, "#"):
		return "", invalidf("%s: URL %s has a fragment (#), which is never sent to the server", name, quoteFromImage(s))
	}
	return s, nil
}

// parseSHA256 checks the text of PointerSHA256File and returns the digest
// in lowercase.
func parseSHA256(text []byte) (string, error) {
	const name = "pointer file " + PointerSHA256File
	s, err := pointerLine(name, text, "a sha256 digest (64 hex digits)", "one sha256 digest")
	if err != nil {
		return "", err
	}
	// sha256sum writes "HEX  name" (or "HEX *name"): the name is ignored.
	field := strings.Fields(s)[0]
	hex := field
	if len(hex) >= len("sha256:") && strings.EqualFold(hex[:len("sha256:")], "sha256:") {
		hex = hex[len("sha256:"):]
	}
	if len(hex) != 64 || strings.IndexFunc(hex, isNotHex) >= 0 {
		return "", invalidf("%s: %s is not a sha256 digest (64 hex digits)", name, quoteFromImage(field))
	}
	return strings.ToLower(hex), nil
}

func isNotHex(r rune) bool {
	return !('0' <= r && r <= '9' || 'a' <= r && r <= 'f' || 'A' <= r && r <= 'F')
}

// describeURLRune names a character an error cannot show as it is.
func describeURLRune(r rune) string {
	if r == ' ' {
		return "a space"
	}
	return fmt.Sprintf("the character %U", r)
}

// quoteFromImage quotes text from an image for an error: escaped, and cut to
// maxQuoted bytes.
func quoteFromImage(s string) string {
	if len(s) <= maxQuoted {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q…", cutUTF8(s, maxQuoted))
}

// capMessage cuts s, a message that already quotes what it took from an
// image, to n bytes.
func capMessage(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return cutUTF8(s, n) + "…"
}

// cutUTF8 returns at most n bytes of s, not splitting a UTF-8 character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// quoteImageNames quotes the image file names of an error, at most five of them.
func quoteImageNames(names []string) string {
	const most = 5
	q := make([]string, 0, most)
	for i, n := range names {
		if i == most {
			return strings.Join(q, ", ") + fmt.Sprintf(" (and %d more)", len(names)-most)
		}
		q = append(q, quoteFromImage(n))
	}
	return strings.Join(q, ", ")
}

// findPointer reads the pointer files of a /disk whose entries (found,
// rootfs-relative, hidden ones left out) name one of them. /disk must hold
// exactly the two: a pointer image has no disk.
func findPointer(root string, found []string) (*Boot, error) {
	var others []string
	has := map[string]bool{}
	for _, rel := range found {
		if isPointerFile(rel) {
			has[rel] = true
		} else {
			others = append(others, rel)
		}
	}
	switch {
	case len(others) > 0:
		return nil, invalidf("pointer image: /disk holds %s besides %s and %s; a pointer image holds no disk",
			quoteImageNames(others), PointerURLFile, PointerSHA256File)
	case !has[PointerURLFile]:
		return nil, invalidf("pointer image: %s without %s", PointerSHA256File, PointerURLFile)
	case !has[PointerSHA256File]:
		return nil, invalidf("pointer image: %s without %s", PointerURLFile, PointerSHA256File)
	}
	urlText, err := readPointerFile(root, PointerURLFile)
	if err != nil {
		return nil, err
	}
	sumText, err := readPointerFile(root, PointerSHA256File)
	if err != nil {
		return nil, err
	}
	diskURL, sum, err := ParsePointer(urlText, sumText)
	if err != nil {
		return nil, err
	}
	return &Boot{URL: diskURL, SHA256: sum, Root: root}, nil
}

// readPointerFile reads the pointer file rel, resolved inside root as disk
// files are (a regular file, never a symlink out of the image), and at
// most MaxPointerFileSize bytes long.
func readPointerFile(root, rel string) ([]byte, error) {
	_, f, err := resolveFile(root, "pointer file", rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxPointerFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("pointer file %s: %w", rel, pathErr(err))
	}
	if len(data) > MaxPointerFileSize {
		return nil, invalidf("pointer file %s: larger than %d bytes", rel, MaxPointerFileSize)
	}
	return data, nil
}

// isPointerFile reports whether rel, rootfs-relative, names a pointer file.
func isPointerFile(rel string) bool {
	return rel == PointerURLFile || rel == PointerSHA256File
}
