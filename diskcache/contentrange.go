package diskcache

import (
	"errors"
	"strconv"
	"strings"
)

// contentRange is a parsed Content-Range header (RFC 9110, section 14.4).
type contentRange struct {
	// Start and End are the first and last byte positions of the part
	// sent; both are -1 in an unsatisfied range ("bytes */N" of a 416).
	Start, End int64
	// Total is the length of the whole representation, -1 if unknown.
	Total int64
}

// errContentRange is the error for any malformed Content-Range.
var errContentRange = errors.New("malformed Content-Range")

// parseContentRange parses "bytes START-END/TOTAL", "bytes START-END/*" or
// "bytes */TOTAL". It checks START <= END < TOTAL.
func parseContentRange(s string) (contentRange, error) {
	const unit = "bytes "
	if len(s) < len(unit) || !strings.EqualFold(s[:len(unit)], unit) {
		return contentRange{}, errContentRange
	}
	rng, total, ok := strings.Cut(s[len(unit):], "/")
	if !ok {
		return contentRange{}, errContentRange
	}
	cr := contentRange{Start: -1, End: -1, Total: -1}
	if total != "*" {
		n, err := parsePos(total)
		if err != nil {
			return contentRange{}, err
		}
		cr.Total = n
	}
	if rng == "*" {
		if cr.Total < 0 {
			return contentRange{}, errContentRange
		}
		return cr, nil
	}
	first, last, ok := strings.Cut(rng, "-")
	if !ok {
		return contentRange{}, errContentRange
	}
	var err error
	if cr.Start, err = parsePos(first); err != nil {
		return contentRange{}, err
	}
	if cr.End, err = parsePos(last); err != nil {
		return contentRange{}, err
	}
	if cr.End < cr.Start || (cr.Total >= 0 && cr.End >= cr.Total) {
		return contentRange{}, errContentRange
	}
	return cr, nil
}

// parsePos parses a non-negative decimal int64 with digits only.
func parsePos(s string) (int64, error) {
	if s == "" || len(s) > 19 {
		return 0, errContentRange
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errContentRange
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errContentRange
	}
	return n, nil
}
