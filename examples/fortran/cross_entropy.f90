! Cut cross-entropy from Fortran through the C API, checked against plain loops; the training
! step in one call, checked against the forward and the backward; then a bad target, which fails
! with a message naming it.
program cross_entropy
  use tlse
  implicit none
  integer, parameter :: n = 30, v = 200, d = 8
  real(c_double), target :: e(d, n), c(d, v), de(d, n), dc(d, v)   ! row-major n x d, v x d in C
  real(c_double), target :: step_de(d, n), step_dc(d, v), step_loss
  integer(c_int64_t), target :: targets(n)
  real(c_double), target :: loss, lse(n), dloss
  type(tlse_cross_entropy_options) :: options
  type(c_ptr) :: context
  real(c_double) :: logits(v), expected
  integer :: i, j, k
  integer(c_int) :: status

  do i = 1, n
    do k = 1, d
      e(k, i) = sin(0.3d0 * (i * d + k))
    end do
    targets(i) = mod(7 * i, v)  ! 0-based class indices, as in C
  end do
  do j = 1, v
    do k = 1, d
      c(k, j) = cos(0.2d0 * (j * d + k))
    end do
  end do

  call tlse_check(tlse_context_create(context, -1_c_int))
  call tlse_cross_entropy_options_default(options)
  call tlse_check(tlse_cross_entropy_forward(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, int(n, c_int64_t), &
      int(v, c_int64_t), int(d, c_int64_t), c_loc(e), c_loc(c), c_null_ptr, c_loc(targets), c_loc(loss), &
      c_loc(lse), c_null_ptr, c_null_ptr, options))
  dloss = 1
  call tlse_check(tlse_cross_entropy_backward(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, int(n, c_int64_t), &
      int(v, c_int64_t), int(d, c_int64_t), c_loc(e), c_loc(c), c_null_ptr, c_loc(targets), c_loc(lse), &
      c_null_ptr, c_loc(dloss), c_loc(de), c_loc(dc), c_null_ptr, c_null_ptr, options))

  expected = 0
  do i = 1, n
    logits = matmul(e(:, i), c)
    expected = expected + (log_sum_exp(logits) - logits(targets(i) + 1)) / n
  end do
  print '(a, f12.8, a, f12.8)', 'Fortran: TiledLSE cross-entropy', loss, ', loops', expected
  if (abs(loss - expected) > 1d-10 * (1 + abs(expected))) stop 1

  ! The same loss and gradients from one call (the forward's logits become the gradient on GPUs).
  call tlse_check(tlse_cross_entropy_with_gradients(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, &
      int(n, c_int64_t), int(v, c_int64_t), int(d, c_int64_t), c_loc(e), c_loc(c), c_null_ptr, c_loc(targets), &
      c_loc(dloss), c_loc(step_loss), c_loc(step_de), c_loc(step_dc), c_null_ptr, c_null_ptr, &
      options))
  print '(a, f12.8, a, es9.2)', 'Fortran: the step in one call', step_loss, ', largest gradient difference', &
      max(maxval(abs(step_de - de)), maxval(abs(step_dc - dc)))
  if (abs(step_loss - loss) > 1d-12 * (1 + abs(loss))) stop 1
  if (maxval(abs(step_de - de)) > 1d-12 * (1 + maxval(abs(de)))) stop 1
  if (maxval(abs(step_dc - dc)) > 1d-12 * (1 + maxval(abs(dc)))) stop 1

  targets(3) = -7
  status = tlse_cross_entropy_forward(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, int(n, c_int64_t), &
      int(v, c_int64_t), int(d, c_int64_t), c_loc(e), c_loc(c), c_null_ptr, c_loc(targets), c_loc(loss), &
      c_null_ptr, c_null_ptr, c_null_ptr, options)
  print '(a, i0, 2a)', 'bad target: status ', status, ', ', tlse_last_error()
  if (status /= TLSE_ERROR_INVALID_ARGUMENT) stop 1
  call tlse_check(tlse_context_destroy(context))
end program cross_entropy
