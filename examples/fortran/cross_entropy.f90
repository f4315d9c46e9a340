! Cut cross-entropy from Fortran through the C API, checked against plain loops; then a bad
! target, which fails with a message naming it.
program cross_entropy
  use tlse
  implicit none
  integer, parameter :: n = 30, v = 200, d = 8
  real(c_double), target :: e(d, n), c(d, v), de(d, n), dc(d, v)   ! row-major n x d, v x d in C
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

  call check(tlse_context_create(context, -1_c_int))
  call tlse_cross_entropy_options_default(options)
  call check(tlse_cross_entropy_forward(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, int(n, c_int64_t), &
      int(v, c_int64_t), int(d, c_int64_t), c_loc(e), c_loc(c), c_null_ptr, c_loc(targets), c_loc(loss), &
      c_loc(lse), c_null_ptr, options))
  dloss = 1
  call check(tlse_cross_entropy_backward(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, int(n, c_int64_t), &
      int(v, c_int64_t), int(d, c_int64_t), c_loc(e), c_loc(c), c_null_ptr, c_loc(targets), c_loc(lse), &
      c_null_ptr, c_loc(dloss), c_loc(de), c_loc(dc), c_null_ptr, options))

  expected = 0
  do i = 1, n
    logits = matmul(e(:, i), c)
    expected = expected + (maxval(logits) + log(sum(exp(logits - maxval(logits)))) - logits(targets(i) + 1)) / n
  end do
  print '(a, f12.8, a, f12.8)', 'Fortran: TiledLSE cross-entropy', loss, ', loops', expected
  if (abs(loss - expected) > 1d-10 * (1 + abs(expected))) stop 1

  targets(3) = -7
  status = tlse_cross_entropy_forward(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, int(n, c_int64_t), &
      int(v, c_int64_t), int(d, c_int64_t), c_loc(e), c_loc(c), c_null_ptr, c_loc(targets), c_loc(loss), &
      c_null_ptr, c_null_ptr, options)
  print '(a, i0, 2a)', 'bad target: status ', status, ', ', tlse_last_error()
  if (status /= TLSE_ERROR_INVALID_ARGUMENT) stop 1
  call check(tlse_context_destroy(context))

contains

  subroutine check(status)
    integer(c_int), intent(in) :: status
    if (status /= TLSE_SUCCESS) then
      print '(a)', tlse_last_error()
      stop 1
    end if
  end subroutine

end program cross_entropy
