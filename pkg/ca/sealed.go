package ca

import (
	"bufio"
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/shardpilot/shardpilot/pkg/store"
)

// SealedRootKey is where a root created on the first start is kept: sealed
// (AES-256-GCM) with a key the pushers alone hold (SealKeys), under the
// prefix only the pushers' etcd user may read, outside /mesh/v1/ (the
// relay does not publish it).
const SealedRootKey = store.PusherPrefix + "ca/root"

// LegacyRootKey is where earlier releases kept the root unsealed, readable
// by any etcd user of the mesh's keys. A pusher that can read it seals it
// under SealedRootKey and deletes it, so that the workload certificates
// already issued stay trusted.
const LegacyRootKey = "/shardpilot/ca/root"

// SealKeys are the 256-bit keys that seal the root kept in etcd. The first
// seals; every one opens, so that the key can be replaced: a root opened
// with another than the first is sealed again with the first.
type SealKeys [][]byte

// ReadSealKeys reads a file of one key per line, each 32 random bytes in
// base64 (openssl rand -base64 32); empty lines and # comments are skipped.
func ReadSealKeys(file string) (SealKeys, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("ca: seal keys: %w", err)
	}
	var keys SealKeys
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := base64.StdEncoding.DecodeString(line)
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("ca: seal keys: %s:%d: want 32 bytes in base64 (openssl rand -base64 32)", file, n)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("ca: seal keys: %s holds no key", file)
	}
	return keys, nil
}

// sealed is SealedRootKey's value.
type sealed struct {
	// Key identifies the seal key: the start of its SHA-256, in hex.
	Key   string `json:"key"`
	Nonce []byte `json:"nonce"`
	Box   []byte `json:"box"`
}

func keyID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

func (k SealKeys) seal(plain []byte) ([]byte, error) {
	gcm, err := newGCM(k[0])
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return json.Marshal(sealed{Key: keyID(k[0]), Nonce: nonce, Box: gcm.Seal(nil, nonce, plain, []byte(SealedRootKey))})
}

// open returns the root's plain value and whether the first key sealed it.
func (k SealKeys) open(value []byte) (plain []byte, first bool, err error) {
	var s sealed
	if err := json.Unmarshal(value, &s); err != nil {
		return nil, false, fmt.Errorf("ca: %s: %w", SealedRootKey, err)
	}
	for i, key := range k {
		if keyID(key) != s.Key {
			continue
		}
		gcm, err := newGCM(key)
		if err != nil {
			return nil, false, err
		}
		if len(s.Nonce) != gcm.NonceSize() {
			return nil, false, fmt.Errorf("ca: %s: a nonce of %d bytes", SealedRootKey, len(s.Nonce))
		}
		plain, err := gcm.Open(nil, s.Nonce, s.Box, []byte(SealedRootKey))
		if err != nil {
			return nil, false, fmt.Errorf("ca: %s: sealed with key %s, which does not open it: %w", SealedRootKey, s.Key, err)
		}
		return plain, i == 0, nil
	}
	return nil, false, fmt.Errorf("ca: %s: sealed with key %s, which is not among the seal keys given (%d)", SealedRootKey, s.Key, len(k))
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// FromStore returns the root sealed at SealedRootKey, creating it on the
// first start: of replicas starting at once, one creates it and the others
// read it. A root unsealed at LegacyRootKey, when there is one the pusher
// may read, is sealed and adopted instead of a new one.
func FromStore(ctx context.Context, st *store.Store, trustDomain string, keys SealKeys, log *slog.Logger) (*CA, error) {
	if len(keys) == 0 {
		return nil, errors.New("ca: a root kept in etcd needs a seal key")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for range 3 {
		sealed, modRev, err := st.Value(ctx, SealedRootKey)
		if err != nil {
			return nil, fmt.Errorf("ca: read %s: %w", SealedRootKey, err)
		}
		if sealed != nil {
			plain, first, err := keys.open(sealed)
			if err != nil {
				return nil, err
			}
			if !first {
				reseal(ctx, st, keys, plain, modRev, log)
			}
			return decode(plain, SealedRootKey)
		}
		plain, legacy, err := legacyRoot(ctx, st, log)
		if err != nil {
			return nil, err
		}
		fresh := plain == nil
		if fresh {
			if plain, err = newRoot(trustDomain); err != nil {
				return nil, err
			}
		}
		value, err := keys.seal(plain)
		if err != nil {
			return nil, err
		}
		created, err := st.CreateValue(ctx, SealedRootKey, value)
		if err != nil {
			return nil, fmt.Errorf("ca: %w", err)
		}
		if !created {
			continue // another replica created it first: read theirs
		}
		if fresh {
			// Right on a mesh's first start; on any other, etcd lost the
			// root (wiped, or restored from a backup without it), and the
			// proxies' certificates of the old root no longer verify
			// against what the new one's proxies trust.
			log.Warn("a new root was created: no root was kept in etcd. On a mesh's first start this is expected; otherwise etcd lost the root, and workloads whose certificates the old root signed are not trusted by those the new one signs until they renew: restore the root from a backup (docs/disaster-recovery.md) or restart the workloads",
				"key", SealedRootKey, "trust_domain", trustDomain)
		}
		if legacy {
			if err := st.DeleteValue(ctx, LegacyRootKey); err != nil {
				log.Warn("the root is sealed now, but its unsealed copy could not be deleted: delete it", "key", LegacyRootKey, "error", err)
			} else {
				log.Info("the root kept unsealed is sealed now", "from", LegacyRootKey, "to", SealedRootKey)
			}
		}
		return decode(plain, SealedRootKey)
	}
	return nil, fmt.Errorf("ca: %s keeps changing", SealedRootKey)
}

// legacyRoot returns the root kept unsealed by earlier releases, or nil
// when there is none or the pusher may not read it.
func legacyRoot(ctx context.Context, st *store.Store, log *slog.Logger) ([]byte, bool, error) {
	value, _, err := st.Value(ctx, LegacyRootKey)
	if store.IsPermissionDenied(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("ca: read %s: %w", LegacyRootKey, err)
	}
	if value == nil {
		return nil, false, nil
	}
	if _, err := decode(value, LegacyRootKey); err != nil {
		log.Warn("the root kept unsealed cannot be read: a new one is made", "key", LegacyRootKey, "error", err)
		return nil, false, nil
	}
	return value, true, nil
}

// reseal seals the root again with the first key, unless another replica
// changed it meanwhile; a failure only leaves it sealed with the older key.
func reseal(ctx context.Context, st *store.Store, keys SealKeys, plain []byte, rev int64, log *slog.Logger) {
	value, err := keys.seal(plain)
	if err == nil {
		_, err = st.PutValueAt(ctx, SealedRootKey, value, rev)
	}
	if err != nil {
		log.Warn("the root could not be sealed with the first seal key: it stays sealed with an older one", "key", SealedRootKey, "error", err)
		return
	}
	log.Info("the root is sealed with the first seal key now", "key", SealedRootKey, "seal_key", keyID(keys[0]))
}

// PublishTrust writes the roots proxies trust (TrustPEM, public) to
// store.TrustKey, unless it holds them already: the ingesters publish
// them in every namespace for Istio's agents.
func PublishTrust(ctx context.Context, st *store.Store, c *CA) error {
	have, _, err := st.Value(ctx, store.TrustKey)
	if err != nil {
		return fmt.Errorf("ca: read %s: %w", store.TrustKey, err)
	}
	if bytes.Equal(have, c.TrustPEM()) {
		return nil
	}
	if err := st.PutValue(ctx, store.TrustKey, c.TrustPEM()); err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	return nil
}
