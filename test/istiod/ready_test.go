package istiod

import (
	"net/http"
	"time"
)

// ready reports whether an HTTP readiness endpoint answers 200.
func ready(url string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
