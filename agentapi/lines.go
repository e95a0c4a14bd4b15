package agentapi

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
)

// prefixKeep is how much of an over-long line is kept, to recover its
// request id (see idFromPrefix).
const prefixKeep = 128

// keepBuf is the largest line buffer kept between lines.
const keepBuf = 1 << 20

// keepIdle is the largest line buffer kept by release: a reader that may
// wait long for its next line (a Client between two calls) keeps no more.
const keepIdle = 64 << 10

// lineReader reads newline-terminated lines of at most max bytes. A longer
// line is not buffered: its bytes are discarded up to the next newline and
// reported as an overflow, keeping only a short prefix.
type lineReader struct {
	br  *bufio.Reader
	max int
	buf []byte
	// cur is the line being read; resume says a read deadline cut it
	// short and the next call goes on with it.
	cur    line
	resume bool
}

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{br: bufio.NewReaderSize(r, 64<<10), max: max}
}

// line is one line read by lineReader.
type line struct {
	data     []byte // the line without its newline (nil when overflowed)
	overflow int64  // >0: the line was this many bytes long (more than max) and was dropped
	prefix   []byte // the first bytes of an overflowed line
}

// next returns the next line. A last line without a newline before EOF is
// returned as a line; io.EOF comes only when nothing is left. The returned
// data is valid until the next call.
//
// When the underlying reader's deadline passes (os.ErrDeadlineExceeded),
// the bytes of the line read so far are kept and the next call goes on with
// them, so a read given up on does not lose a partly received line.
func (lr *lineReader) next() (line, error) {
	if !lr.resume {
		if cap(lr.buf) > keepBuf {
			lr.buf = nil // do not hold on to the memory of one huge line
		}
		lr.buf = lr.buf[:0]
		lr.cur = line{}
	}
	lr.resume = false
	l := &lr.cur
	for {
		chunk, err := lr.br.ReadSlice('\n')
		if need := len(lr.buf) + len(chunk); l.overflow == 0 && need <= lr.max+1 {
			if need > cap(lr.buf) {
				grown := make([]byte, len(lr.buf), min(max(2*cap(lr.buf), need), lr.max+1))
				copy(grown, lr.buf)
				lr.buf = grown
			}
			lr.buf = append(lr.buf, chunk...)
		} else {
			if l.overflow == 0 {
				keep := min(prefixKeep, len(lr.buf)+len(chunk))
				l.prefix = append(append([]byte(nil), lr.buf...), chunk...)[:keep]
				l.overflow = int64(len(lr.buf))
				lr.buf = lr.buf[:0]
			}
			l.overflow += int64(len(chunk))
		}
		switch {
		case err == nil:
			return lr.finish(*l), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(lr.buf) == 0 && l.overflow == 0 {
				return line{}, io.EOF
			}
			return lr.finish(*l), nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			lr.resume = true
			return line{}, err
		default:
			return line{}, err
		}
	}
}

// release drops the line buffer when it grew past keepIdle, once the last
// line was used: a Client holding one session per gateway would otherwise
// keep the memory of each gateway's last List response (hundreds of KiB at
// 1k objects) until its next call. A partly read line is kept.
func (lr *lineReader) release() {
	if !lr.resume && cap(lr.buf) > keepIdle {
		lr.buf = nil
		lr.cur = line{}
	}
}

func (lr *lineReader) finish(l line) line {
	if l.overflow > 0 {
		return l
	}
	d := bytes.TrimSuffix(lr.buf, []byte{'\n'})
	d = bytes.TrimSuffix(d, []byte{'\r'})
	if len(d) > lr.max {
		// Only possible when the newline made the difference.
		return line{overflow: int64(len(d)), prefix: append([]byte(nil), d[:min(prefixKeep, len(d))]...)}
	}
	l.data = d
	return l
}

// idFromPrefix recovers the request id from the beginning of a line that
// could not be decoded (over-long or malformed), so that the error response
// can name it: it accepts `{"id":123` with optional spaces, the form Client
// writes. complete says p is the whole line rather than a cut-off prefix (a
// number running into the cut is not trusted). It returns 0, false when the
// line does not start like that.
func idFromPrefix(p []byte, complete bool) (uint64, bool) {
	p = bytes.TrimLeft(p, " \t")
	if len(p) == 0 || p[0] != '{' {
		return 0, false
	}
	p = bytes.TrimLeft(p[1:], " \t")
	if !bytes.HasPrefix(p, []byte(`"id"`)) {
		return 0, false
	}
	p = bytes.TrimLeft(p[4:], " \t")
	if len(p) == 0 || p[0] != ':' {
		return 0, false
	}
	p = bytes.TrimLeft(p[1:], " \t")
	var id uint64
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			break
		}
		d := uint64(c - '0')
		if id > (^uint64(0)-d)/10 {
			return 0, false // overflow
		}
		id = id*10 + d
		n++
	}
	if n == 0 || n == len(p) && !complete {
		return 0, false
	}
	if n < len(p) {
		switch p[n] {
		case ',', '}', ' ', '\t':
		default:
			return 0, false
		}
	}
	return id, true
}
