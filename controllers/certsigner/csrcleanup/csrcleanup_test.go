package csrcleanup

import (
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestDecide(t *testing.T) {
	created := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	csr := func(cert bool, conds ...certv1.RequestConditionType) *certv1.CertificateSigningRequest {
		c := &certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
		for _, t := range conds {
			c.Status.Conditions = append(c.Status.Conditions, certv1.CertificateSigningRequestCondition{Type: t, Status: corev1.ConditionTrue})
		}
		if cert {
			c.Status.Certificate = []byte("pem")
		}
		return c
	}
	falseDenied := csr(false)
	falseDenied.Status.Conditions = []certv1.CertificateSigningRequestCondition{{Type: certv1.CertificateDenied, Status: corev1.ConditionFalse}}
	r := DefaultRetention
	for _, c := range []struct {
		name   string
		csr    *certv1.CertificateSigningRequest
		age    time.Duration
		remove bool
		after  time.Duration
	}{
		{"issued, fresh", csr(true, certv1.CertificateApproved), 10 * time.Minute, false, 50 * time.Minute},
		{"issued, an hour old", csr(true, certv1.CertificateApproved), time.Hour, true, 0},
		{"denied, an hour old", csr(false, certv1.CertificateDenied), time.Hour, false, 23 * time.Hour},
		{"denied, a day old", csr(false, certv1.CertificateDenied), 24 * time.Hour, true, 0},
		{"approved then failed, two hours old", csr(false, certv1.CertificateApproved, certv1.CertificateFailed), 2 * time.Hour, false, 22 * time.Hour},
		{"failed, a day and a minute old", csr(false, certv1.CertificateApproved, certv1.CertificateFailed), 24*time.Hour + time.Minute, true, 0},
		{"pending, two hours old", csr(false), 2 * time.Hour, false, 22 * time.Hour},
		{"approved, never signed, a day old", csr(false, certv1.CertificateApproved), 24 * time.Hour, true, 0},
		{"a false Denied condition is pending", falseDenied, 2 * time.Hour, false, 22 * time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(created)
			clk.Step(c.age)
			remove, after := Decide(c.csr, clk.Now(), r)
			if remove != c.remove || after != c.after {
				t.Errorf("Decide at %v = %v, %v; want %v, %v", c.age, remove, after, c.remove, c.after)
			}
		})
	}
}
