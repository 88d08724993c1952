package server

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// KeyHashSecretEnv names the environment variable Server reads the
// top-key labels' secret from when Options.KeyHashSecret is empty. An
// environment variable rather than a flag: a flag shows in every process
// listing.
const KeyHashSecretEnv = "SLUICE_KEY_HASH_SECRET"

// MinKeyHashSecret is the shortest secret accepted, in bytes: a short one
// could be guessed along with the keys.
const MinKeyHashSecret = 16

// ErrKeyHashSecret: the top-key labels' secret is set but empty or too
// short.
var ErrKeyHashSecret = errors.New("server: invalid key hash secret")

// keyHashSecret returns the secret from opt, else from the environment;
// "" for none (a random one per process).
func keyHashSecret(opt string) (string, error) {
	from := "KeyHashSecret"
	if opt == "" {
		v, ok := os.LookupEnv(KeyHashSecretEnv)
		if !ok {
			return "", nil
		}
		// Set but empty is a secret that came out empty, not a request for
		// the default, which would make every instance's labels differ.
		if strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("%w: %s is set but empty: give it a secret of at least %d bytes, the same on every instance, or unset it for a random one per process",
				ErrKeyHashSecret, KeyHashSecretEnv, MinKeyHashSecret)
		}
		opt, from = v, KeyHashSecretEnv
	}
	if len(opt) < MinKeyHashSecret {
		return "", fmt.Errorf("%w: %s is %d bytes, want at least %d (random ones, such as 32 bytes hex-encoded)", ErrKeyHashSecret, from, len(opt), MinKeyHashSecret)
	}
	return opt, nil
}
