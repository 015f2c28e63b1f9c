package telemetry

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"time"
)

// TokenSource gives the bearer token that opens /debug/ and the status page
// to other hosts; "" opens them to nobody else.
type TokenSource interface {
	Token() string
}

// StaticToken is a token that never changes.
type StaticToken string

// Token returns the token.
func (t StaticToken) Token() string { return string(t) }

// MinTokenLength is the shortest admin token taken.
const MinTokenLength = 32

// CheckToken refuses a token that could be guessed: shorter than
// MinTokenLength, or not random-looking (a few characters repeated: under
// 3 bits of entropy per character, as `openssl rand -hex 32` or `-base64
// 32` are well above).
func CheckToken(tok string) error {
	if len(tok) < MinTokenLength {
		return fmt.Errorf("the token has %d characters; want at least %d (openssl rand -hex 32)", len(tok), MinTokenLength)
	}
	counts := map[rune]int{}
	n := 0
	for _, r := range tok {
		counts[r]++
		n++
	}
	bits := 0.0
	for _, c := range counts {
		p := float64(c) / float64(n)
		bits -= p * math.Log2(p)
	}
	if bits < 3 {
		return fmt.Errorf("the token is not random-looking (%.1f bits of entropy per character, %d distinct characters); make one with openssl rand -hex 32", bits, len(counts))
	}
	return nil
}

// TokenFile is a token read from a file and read again when the file
// changes (looked at no more than every TokenRecheck, when a token is
// wanted): a rotated Secret takes effect without a restart. A new content
// that CheckToken refuses, or a file that cannot be read, keeps the last
// good token and is logged.
type TokenFile struct {
	path string
	log  *slog.Logger

	mu      sync.Mutex
	token   string
	stamp   string
	checked time.Time
}

// TokenRecheck is how often a TokenFile looks at its file again.
const TokenRecheck = time.Second

// NewTokenFile reads a token file; its first content must pass CheckToken.
func NewTokenFile(path string, log *slog.Logger) (*TokenFile, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &TokenFile{path: path, log: log}
	tok, stamp, err := f.read()
	if err != nil {
		return nil, err
	}
	f.token, f.stamp, f.checked = tok, stamp, time.Now()
	return f, nil
}

// Token returns the file's token, reading the file again when it changed.
func (f *TokenFile) Token() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.checked) < TokenRecheck {
		return f.token
	}
	f.checked = time.Now()
	if st, err := os.Stat(f.path); err == nil && stampOf(st) == f.stamp {
		return f.token
	}
	tok, stamp, err := f.read()
	if err != nil {
		f.log.Warn("cannot read the admin token again; keeping the last one", "err", err)
		return f.token
	}
	if tok != f.token {
		f.log.Info("admin token reloaded", "file", f.path)
	}
	f.token, f.stamp = tok, stamp
	return f.token
}

func (f *TokenFile) read() (tok, stamp string, err error) {
	st, err := os.Stat(f.path)
	if err != nil {
		return "", "", fmt.Errorf("telemetry: admin token: %w", err)
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return "", "", fmt.Errorf("telemetry: admin token: %w", err)
	}
	tok = strings.TrimSpace(string(b))
	if err := CheckToken(tok); err != nil {
		return "", "", fmt.Errorf("telemetry: admin token %s: %w", f.path, err)
	}
	return tok, stampOf(st), nil
}

func stampOf(st os.FileInfo) string { return fmt.Sprintf("%d/%d", st.Size(), st.ModTime().UnixNano()) }
