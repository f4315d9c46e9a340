! The CLIP contrastive loss from Fortran through the C API: the loss and its gradients (images,
! texts and the logit scale) checked against plain loops, then a negative scale, which fails with
! a message naming it and leaves the loss as it was.
program contrastive
  use tlse
  implicit none
  integer, parameter :: b = 40, dim = 8
  real(c_double), target :: images(dim, b), texts(dim, b), dimages(dim, b), dtexts(dim, b)  ! row-major b x dim in C
  real(c_double), target :: loss, row_lse(b), col_lse(b), dloss, dscale
  type(tlse_contrastive_options) :: options
  type(c_ptr) :: context
  real(c_double) :: x(b, b), row_lse_ref(b), col_lse_ref(b), g(b, b), expected, expected_dscale, error
  integer :: i, j, k
  integer(c_int) :: status

  do i = 1, b
    do k = 1, dim
      images(k, i) = 0.3d0 * sin(0.7d0 * (i * dim + k))
      texts(k, i) = 0.3d0 * cos(0.5d0 * (i * dim + k))
    end do
  end do

  call tlse_check(tlse_context_create(context, -1_c_int))
  call tlse_contrastive_options_default(options)
  options%scale = 14.3d0  ! 1 / temperature; symmetric direction and image i <-> text i by default
  call tlse_check(tlse_contrastive_forward(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, int(b, c_int64_t), &
      int(dim, c_int64_t), c_loc(images), c_loc(texts), c_null_ptr, c_loc(loss), c_loc(row_lse), c_loc(col_lse), &
      options))
  dloss = 1
  call tlse_check(tlse_contrastive_backward(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, int(b, c_int64_t), &
      int(dim, c_int64_t), c_loc(images), c_loc(texts), c_null_ptr, c_loc(row_lse), c_loc(col_lse), c_loc(dloss), &
      c_loc(dimages), c_loc(dtexts), c_loc(dscale), c_null_ptr, options))

  ! Loops: x(i, j) = scale images_i . texts_j; loss = mean over i of (lse of row i - x(i, i)) and
  ! of (lse of column i - x(i, i)), halved; dL/dx = (softmax of the row + softmax of the column
  ! - 2 at the diagonal) / (2 b).
  x = options%scale * matmul(transpose(images), texts)
  do i = 1, b
    row_lse_ref(i) = log_sum_exp(x(i, :))
    col_lse_ref(i) = log_sum_exp(x(:, i))
  end do
  expected = 0
  do i = 1, b
    expected = expected + 0.5d0 * (row_lse_ref(i) - x(i, i) + col_lse_ref(i) - x(i, i)) / b
  end do
  do j = 1, b
    do i = 1, b
      g(i, j) = (exp(x(i, j) - row_lse_ref(i)) + exp(x(i, j) - col_lse_ref(j))) / (2 * b)
    end do
    g(j, j) = g(j, j) - 1d0 / b
  end do
  expected_dscale = sum(g * x) / options%scale
  error = max(maxval(abs(dimages - options%scale * matmul(texts, transpose(g)))), &
      maxval(abs(dtexts - options%scale * matmul(images, g))), abs(dscale - expected_dscale))
  print '(a, f14.10, a, f14.10, a, es9.2)', 'Fortran: TiledLSE contrastive', loss, ', loops', expected, &
      ', largest gradient difference', error
  if (abs(loss - expected) > 1d-10 * (1 + abs(expected))) stop 1
  if (error > 1d-10) stop 1

  options%scale = -1
  loss = 42
  status = tlse_contrastive_forward(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, int(b, c_int64_t), &
      int(dim, c_int64_t), c_loc(images), c_loc(texts), c_null_ptr, c_loc(loss), c_null_ptr, c_null_ptr, options)
  print '(a, i0, 2a)', 'negative scale: status ', status, ', ', tlse_last_error()
  if (status /= TLSE_ERROR_INVALID_ARGUMENT .or. loss /= 42) stop 1
  call tlse_check(tlse_context_destroy(context))
end program contrastive
